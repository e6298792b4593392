"""A Report as text: ``text`` or ``latex`` (DomainBed's), ``markdown`` or ``csv`` (one tidy row
per cell), with the papers' numbers under their tables and the selected hparams."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from dg_plugins.collect.tables import PaperComparison, Report, Table
from dg_plugins.job.records import format_row

NO_PAPER_VALUE = "-"  # where the paper gives no number, or no difference can be taken
NOT_AVAILABLE = "not available in the sources we have"

FORMATS = ("text", "latex", "markdown", "csv")
#: The file each format is also written to, as DomainBed writes results.txt / results.tex.
RESULTS_FILES = {"text": "results.txt", "latex": "results.tex", "markdown": "results.md",
                 "csv": "results.csv"}
HPARAMS_FILE = "selected_hparams.csv"


def render(report: Report, fmt: str = "text") -> str:
    """The report as printed and saved (``text``/``latex``: DomainBed's, byte for byte)."""
    if fmt not in _RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    return _RENDERERS[fmt](report)


def _render_text(report: Report) -> str:
    """DomainBed's output (its ``print_table`` per table), then the selected hparams."""
    lines = [f"Total records: {report.n_records}"]
    for section in report.sections:
        for table in section.tables:
            lines += ["", f"-------- {table.header}"]
            if table.col_labels:
                lines.append(format_row(["Algorithm", *table.col_labels], table.colwidth))
                lines += [format_row(row, table.colwidth) for row in table.text_rows()]
                for comparison in table.comparisons:
                    lines += _comparison_text(comparison, table)
            if table.left_out:
                lines.append(table.left_out)
    lines += _hparams_lines(report)
    return "\n".join(lines) + "\n"


def _paper_texts(values, sign: str = "+/-") -> list[str]:
    return [NO_PAPER_VALUE if value is None else value.text(sign) for value in values]


def _difference_texts(differences) -> list[str]:
    return [NO_PAPER_VALUE if value is None else f"{value:+.1f}" for value in differences]


def _mapping_text(comparison: PaperComparison, arrow: str = "<->") -> str:
    return ", ".join(f"{ours} {arrow} {row}" for ours, row in comparison.mapping.items())


def _comparison_text(comparison: PaperComparison, table: Table) -> list[str]:
    """The paper's rows and ours minus the paper's, in the table's columns."""
    lines = [comparison.heading, comparison.details]
    if comparison.claim is not None:
        return lines + [f"paper: {NOT_AVAILABLE}; the source says: {comparison.claim}"]
    lines += [format_row([row, *_paper_texts(values)], table.colwidth)
              for row, values in comparison.rows.items()]
    if comparison.differences:
        lines.append(f"difference (ours - paper), for {_mapping_text(comparison)}:")
        lines += [format_row([f"{ours} - paper", *_difference_texts(values)], table.colwidth)
                  for ours, values in comparison.differences.items()]
    return lines


def _render_latex(report: Report) -> str:
    """DomainBed's ``--latex`` output, then the selected hparams verbatim."""
    lines = ["\\documentclass{article}", "\\usepackage{booktabs}", "\\usepackage{adjustbox}",
             "\\begin{document}", "\\section{Full DomainBed results}",
             f"% Total records: {report.n_records}"]
    for section in report.sections:
        lines += ["", f"\\subsection{{{section.title}}}"]
        for table in section.tables:
            lines += ["", f"\\subsubsection{{{table.title}}}", ""]
            if not table.col_labels:
                lines.append(_latex_escape(table.left_out or "").replace("--", "-{}-"))
                continue
            labels = ["\\textbf{" + str(label).replace("%", "\\%") + "}"
                      for label in ["Algorithm", *table.col_labels]]
            lines += ["\\begin{center}", "\\adjustbox{max width=\\textwidth}{%",
                      "\\begin{tabular}{l" + "c" * len(table.col_labels) + "}", "\\toprule",
                      format_row(labels, table.colwidth, latex=True), "\\midrule"]
            lines += [format_row(row, table.colwidth, latex=True)
                      for row in table.text_rows("$\\pm$")]
            for comparison in table.comparisons:
                lines += _comparison_latex(comparison, table)
            if table.left_out:
                lines += ["\\midrule",
                          _latex_spanning(table, table.left_out).replace("--", "-{}-")]
            lines += ["\\bottomrule", "\\end{tabular}}", "\\end{center}"]
    hparams = _hparams_lines(report)
    if hparams:
        lines += ["", "\\subsection{Selected hparams}", "\\begin{verbatim}", *hparams,
                  "\\end{verbatim}"]
    lines.append("\\end{document}")
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = str.maketrans({**{c: "\\" + c for c in "&%$#_{}"}, "~": "\\textasciitilde{}",
                                 "^": "\\textasciicircum{}", "\\": "\\textbackslash{}"})


def _latex_escape(text: str) -> str:
    return str(text).translate(_LATEX_SPECIAL)


def _latex_spanning(table: Table, text: str) -> str:
    """A row of ``table``'s tabular across every column, in small type."""
    return (f"\\multicolumn{{{len(table.col_labels) + 1}}}{{l}}{{\\footnotesize "
            f"{_latex_escape(text)}}} \\\\")


def _comparison_latex(comparison: PaperComparison, table: Table) -> list[str]:
    """Rows below a rule: the heading across all columns, the paper's rows, ours minus theirs."""
    spanning = partial(_latex_spanning, table)

    def row(cells) -> str:
        return " & ".join(cells) + " \\\\"

    lines = ["\\midrule", spanning(comparison.heading), spanning(comparison.details.strip())]
    if comparison.claim is not None:
        return lines + [spanning(f"paper: {NOT_AVAILABLE}; the source says: {comparison.claim}")]
    lines += [row([_latex_escape(name), *_paper_texts(values, "$\\pm$")])
              for name, values in comparison.rows.items()]
    if comparison.differences:
        lines += ["\\midrule", spanning(f"difference (ours - paper), for "
                                          f"{_mapping_text(comparison, '=')}")]
        lines += [row([f"{_latex_escape(ours)} $-$ paper",
                       *(_latex_escape(t) for t in _difference_texts(values))])
                  for ours, values in comparison.differences.items()]
    return lines


def _render_markdown(report: Report) -> str:
    """GitHub tables, one heading per section and table, then the selected hparams as code."""
    def row(values) -> str:
        return "| " + " | ".join(str(value).replace("|", "\\|") for value in values) + " |"

    lines = ["# Results", "", f"Total records: {report.n_records}"]
    for section in report.sections:
        lines += ["", f"## {section.title}"]
        for table in section.tables:
            lines += ["", f"### {table.header}", ""]
            if not table.col_labels:
                lines.append(table.left_out or "")
                continue
            rule = "|:--" + "|--:" * len(table.col_labels) + "|"
            lines += [row(["Algorithm", *table.col_labels]), rule]
            lines += [row(texts) for texts in table.text_rows("±")]
            for comparison in table.comparisons:
                lines += ["", f"*{comparison.heading}*  ", f"*{comparison.details.strip()}*", ""]
                if comparison.claim is not None:
                    lines.append(f"Paper: {NOT_AVAILABLE}; the source says: {comparison.claim}")
                    continue
                lines += [row(["Paper row / ours − paper", *table.col_labels]), rule]
                lines += [row([name, *_paper_texts(values, "±")])
                          for name, values in comparison.rows.items()]
                lines += [row([f"{ours} − {comparison.mapping[ours]}",
                               *_difference_texts(values)])
                          for ours, values in comparison.differences.items()]
            if table.left_out:
                lines += ["", table.left_out]
    hparams = _hparams_lines(report)
    if hparams:
        lines += ["", "## Selected hparams", "", "```", *hparams, "```"]
    return "\n".join(lines) + "\n"


def _render_csv(report: Report) -> str:
    """:func:`tidy_cells` as CSV, then the selected hparams as a second CSV after an empty line."""
    text = tidy_cells(report).astype({"n": "Int64"}).to_csv(index=False, lineterminator="\n",
                                                             float_format="%.10g")
    return text + ("" if report.hparams is None else "\n" + hparams_csv(report))


_RENDERERS = {"text": _render_text, "latex": _render_latex, "markdown": _render_markdown,
              "csv": _render_csv}


def tidy_cells(report: Report) -> pd.DataFrame:
    """Every cell of every table (and of the paper comparisons), one tidy row each."""
    rows = []
    compared = any(table.comparisons for section in report.sections for table in section.tables)
    extra = ("measured", "") if compared else ()
    for section in report.sections:
        head = (section.method.key, section.method.name, section.test_key)
        for table in section.tables:
            rows += [(*head, table.title, algorithm, column, cell.mean, cell.err, cell.n, text,
                      *extra)
                     for (algorithm, cells), texts in zip(table.rows.items(), table.text_rows())
                     for column, cell, text in zip(table.col_labels, cells, texts[1:])]
            for comparison in table.comparisons:
                if comparison.claim is not None:
                    rows.append((*head, table.title, "", "", None, None, None,
                                 f"{NOT_AVAILABLE}; the source says: {comparison.claim}",
                                 "paper", comparison.key))
                rows += [(*head, table.title, name, column, value.mean, value.pm, None,
                          value.text(), "paper", comparison.key)
                         for name, values in comparison.rows.items()
                         for column, value in zip(table.col_labels, values) if value is not None]
                rows += [(*head, table.title, ours, column, value, None, None, f"{value:+.1f}",
                          "difference", comparison.key)
                         for ours, values in comparison.differences.items()
                         for column, value in zip(table.col_labels, values) if value is not None]
    columns = ["selection", "selection_name", "test_key", "table", "algorithm", "column", "mean",
               "err", "n", "text"] + (["kind", "paper"] if compared else [])
    return pd.DataFrame(rows, columns=columns)


def _hparams_lines(report: Report) -> list[str]:
    """The selected hparams as aligned plain text, a block per method after an empty line."""
    if report.hparams is None:
        return []
    head = ["Dataset", "Algorithm", "Test env", "Trial", "hparams_seed", "Step", "Val acc",
            "Test acc", "Job", "hparams"]
    lines = []
    for method in report.methods:
        chosen = report.hparams[report.hparams["selection"] == method.key]
        body = [[r.dataset, r.algorithm, f"{r.test_env_label} ({r.test_env})", r.trial_seed,
                 r.hparams_seed, r.step, *("X" if v is None or np.isnan(v) else f"{100 * v:.1f}"
                                           for v in (r.val_acc, r.test_acc)), r.job,
                 r.hparams] for r in chosen.itertuples()]
        body = [[str(v) for v in row] for row in [head, *body]]
        widths = [max(len(row[i]) for row in body) for i in range(len(head) - 1)]
        lines += ["", f"-------- Selected hparams, model selection method: {method.name}"]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) + "  " + row[-1]
                  for row in body]
    return lines


def hparams_csv(report: Report) -> str:
    """The ``selected_hparams.csv`` file of a report built with ``hparams_table``."""
    return report.hparams.to_csv(index=False, lineterminator="\n")
