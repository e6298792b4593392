"""Results tables: DomainBed's collect_results output, byte for byte, plus Markdown, CSV, IP/OOP and
selected-hparams tables (protocol spec 6.5, 9.5).

Per selection method: one table per dataset (rows: algorithms; columns: the dataset's environments
and ``Avg``) and an Averages table (columns: datasets and ``Avg``). A cell is
:func:`format_mean` over trial seeds of the groups' selected test accuracies; ``Avg`` is the plain
mean of the row's cell means, or ``X`` when a cell is missing. DomainBed's quirks are kept: the
population std divided by sqrt(n) as error, the Averages table averaging each trial over whatever
test environments it has (a dataset can show ``X`` in its own table and a number in the Averages),
``print_row``'s truncation of every cell to the column width and its trailing space (text) or
`` \\\\`` (LaTeX).

Ordering: algorithms in :data:`dg_plugins.catalog.ALGORITHM_ORDER` order, then unknown ones by
first appearance in the records (as DomainBed); datasets in
:data:`dg_plugins.catalog.DATASET_ENVIRONMENTS` order. Unlike DomainBed, which silently drops a
dataset it does not know, unknown datasets follow the known ones in alphabetical order, their
environment columns labelled ``0, 1, ...`` (the environment count read from the records'
``env{i}_in_acc`` keys).

Formats (:func:`render`): ``text`` and ``latex`` are DomainBed's; ``markdown`` makes GitHub tables
(``A ± B`` cells); ``csv`` is one tidy table with a row per cell: ``selection, selection_name,
test_key, table, algorithm, column, mean, err, n, text`` (mean and err in percent; ``table`` is the
dataset or ``Averages``; ``n`` the number of trials, empty for ``Avg``).

Extra test keys: :func:`subset_keys` finds ``env{i}_in_ip_acc`` / ``env{i}_in_oop_acc`` columns
(accuracy of the test environment's in split on its in-pretraining / out-of-pretraining subset);
their tables come after the standard ones, with the same selection (the run and checkpoint each
method picks) reporting that key instead of ``env{t}_in_acc``. Without such keys the output is
exactly DomainBed's.

Selected hparams (:func:`selected_hparams`): per method, dataset, algorithm, test environment and
trial, the run the method chose (hparams_seed, step, val/test accuracy, job folder, hparams). With
``Report.hparams`` set, :func:`render` appends it (text/markdown/LaTeX: an aligned plain-text
table; csv: a second CSV after an empty line); :func:`hparams_csv` gives the file.

API: ``build_report(records, methods, hparams_table) -> Report``, ``render(report, fmt) -> str``,
``results_tables(records, method, test_key) -> [Table]``, ``tidy_cells(report) -> DataFrame``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dg_plugins import catalog
from dg_plugins.engine.outputs import format_row
from dg_plugins.engine.records import environment_count
from dg_plugins.engine.selection import (TEST_KEY, GroupedRecords, SelectionMethod, group_records,
                                         select, sweep_accs)

#: Extra test keys reported when present: (template, short label, description).
SUBSET_KEYS = [
    ("env{t}_in_ip_acc", "IP", "in-pretraining subset of the test environment"),
    ("env{t}_in_oop_acc", "OOP", "out-of-pretraining subset of the test environment"),
]
FORMATS = ("text", "latex", "markdown", "csv")
#: File each format is written to (besides stdout), as DomainBed writes results.txt / results.tex.
RESULTS_FILES = {"text": "results.txt", "latex": "results.tex", "markdown": "results.md",
                 "csv": "results.csv"}
HPARAMS_FILE = "selected_hparams.csv"


# --------------------------------------------------------------------------------------------------
# DomainBed's cell and row formatting (spec 6.5, 9.5)


def format_mean(data, latex: bool = False) -> tuple:
    """``(mean, err, text)`` in percent: err is the population std of ``data / sqrt(n)``; text is
    ``"20.0 +/- 4.7"`` (LaTeX: ``$\\pm$``), or ``(None, None, "X")`` for no data (spec 9.5)."""
    data = list(data)
    if not data:
        return None, None, "X"
    mean = 100 * np.mean(data)
    err = 100 * np.std(np.asarray(data) / np.sqrt(len(data)))
    sign = "$\\pm$" if latex else "+/-"
    return mean, err, f"{mean:.1f} {sign} {err:.1f}"


# --------------------------------------------------------------------------------------------------
# Table model


@dataclass
class Cell:
    """A table cell: mean and error in percent (None when absent), number of trials."""

    mean: float | None = None
    err: float | None = None
    n: int | None = None

    def text(self, style: str = "text") -> str:
        if self.mean is None:
            return "X"
        if self.err is None:
            return f"{self.mean:.1f}"
        sign = {"text": "+/-", "latex": "$\\pm$", "markdown": "±", "csv": "+/-"}[style]
        return f"{self.mean:.1f} {sign} {self.err:.1f}"


@dataclass
class Table:
    """One results table. ``title`` is the dataset name or ``Averages``; ``header`` the text-mode
    header; ``rows`` maps each algorithm to its cells (one per column label after ``Algorithm``)."""

    title: str
    header: str
    col_labels: list[str]
    rows: dict[str, list[Cell]]
    colwidth: int
    method: SelectionMethod
    test_key: str = TEST_KEY


def _mean_cell(values: list) -> Cell:
    mean, err, _ = format_mean(values)
    return Cell(mean, err, len(values)) if values else Cell(n=0)


def _avg_cell(cells: list[Cell]) -> Cell:
    means = [c.mean for c in cells]
    if not means or any(m is None for m in means):
        return Cell()
    return Cell(sum(means) / len(means))


def algorithm_order(records: pd.DataFrame | GroupedRecords) -> list[str]:
    """Table rows: known algorithms in catalog order, then unknown ones by first appearance."""
    present = group_records(records).algorithms
    known, seen = set(catalog.ALGORITHM_ORDER), set(present)
    return [a for a in catalog.ALGORITHM_ORDER if a in seen] + [
        a for a in present if a not in known]


def dataset_order(records: pd.DataFrame | GroupedRecords) -> list[str]:
    """Table order: catalog datasets in catalog order, then unknown ones alphabetically."""
    present = set(group_records(records).datasets)
    known = [d for d in catalog.DATASET_ENVIRONMENTS if d in present]
    return known + sorted(present - set(known), key=str)


def environment_labels(records: pd.DataFrame, dataset: str) -> list[str]:
    """Column labels of a dataset: the catalog's, else ``0..n-1`` from its records' keys."""
    if dataset in catalog.DATASET_ENVIRONMENTS:
        return [str(label) for label in catalog.DATASET_ENVIRONMENTS[dataset]]
    rows = records[records["args.dataset"] == dataset]
    return [str(i) for i in range(environment_count(rows))]


def _header(prefix: str, method: SelectionMethod, test_key: str) -> str:
    header = f"{prefix}, model selection method: {method.name}"
    if test_key != TEST_KEY:
        header += f", test accuracy: {test_key}"
    return header


def results_tables(records: pd.DataFrame | GroupedRecords, method: SelectionMethod,
                   test_key: str = TEST_KEY) -> list[Table]:
    """The per-dataset tables and the Averages table of one method (spec 9.5); the test
    accuracy of each chosen record is read with ``test_key`` (a template in ``t``)."""
    grouped = group_records(records)
    frame = grouped.records
    chosen = sweep_accs(grouped, method, test_key)
    algorithms, datasets = algorithm_order(grouped), dataset_order(grouped)
    # Accuracies per cell, in group order (first appearance), as DomainBed lists them.
    per_cell = {key: list(values) for key, values in
                chosen.groupby(["dataset", "algorithm", "test_env"], sort=False)["test_acc"]}
    # Averages: per trial (sorted), the mean over the test environments that trial has.
    per_trial = {key: float(np.mean(list(values))) for key, values in
                 chosen.groupby(["algorithm", "dataset", "trial_seed"], sort=True)["test_acc"]}

    tables = []
    for dataset in datasets:
        labels = environment_labels(frame, dataset)
        rows = {}
        for algorithm in algorithms:
            cells = [_mean_cell(per_cell.get((dataset, algorithm, env), []))
                     for env in range(len(labels))]
            rows[algorithm] = cells + [_avg_cell(cells)]
        tables.append(Table(dataset, _header(f"Dataset: {dataset}", method, test_key),
                            [*labels, "Avg"], rows, 20, method, test_key))
    rows = {}
    for algorithm in algorithms:
        cells = [_mean_cell([v for (a, d, _), v in per_trial.items() if (a, d) == (algorithm, ds)])
                 for ds in datasets]
        rows[algorithm] = cells + [_avg_cell(cells)]
    tables.append(Table("Averages", _header("Averages", method, test_key), [*datasets, "Avg"],
                        rows, 25, method, test_key))
    return tables


def subset_keys(records: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The entries of :data:`SUBSET_KEYS` whose key exists for some environment in ``records``."""
    found = []
    for entry in SUBSET_KEYS:
        pattern = re.compile(re.escape(entry[0]).replace(re.escape("{t}"), r"\d+"))
        if any(pattern.fullmatch(str(column)) for column in records.columns):
            found.append(entry)
    return found


# --------------------------------------------------------------------------------------------------
# Selected hparams (which run each method picked)


def selected_hparams(records: pd.DataFrame | GroupedRecords,
                     methods: list[SelectionMethod]) -> pd.DataFrame:
    """One row per (method, dataset, algorithm, test_env, trial) with the chosen run:
    ``selection, dataset, algorithm, test_env, test_env_label, trial_seed, hparams_seed, step,
    val_acc, test_acc, job, output_dir, hparams`` (hparams as sorted-key JSON), in table order."""
    grouped = group_records(records)
    frame = grouped.records
    algorithms, datasets = algorithm_order(grouped), dataset_order(grouped)
    labels = {d: environment_labels(frame, d) for d in datasets}
    parts = []
    for method in methods:
        chosen = select(grouped, method)
        chosen.insert(0, "selection", method.key)
        parts.append(chosen)
    if not parts:
        return pd.DataFrame()
    table = pd.concat(parts, ignore_index=True)
    rec = frame.iloc[table["record"].to_numpy()]
    table["job"] = rec["job"].to_numpy()
    table["output_dir"] = rec["args.output_dir"].to_numpy()
    table["hparams"] = [json.dumps(h, sort_keys=True) for h in rec["hparams"]]
    table["test_env_label"] = [
        labels[d][t] if t < len(labels[d]) else str(t)
        for d, t in zip(table["dataset"], table["test_env"])]
    method_rank = {m.key: i for i, m in enumerate(methods)}
    table = table.assign(
        _m=table["selection"].map(method_rank), _d=table["dataset"].map(datasets.index),
        _a=table["algorithm"].map(algorithms.index))
    table = table.sort_values(["_m", "_d", "_a", "test_env", "trial_seed"], kind="stable")
    return table[["selection", "dataset", "algorithm", "test_env", "test_env_label", "trial_seed",
                  "hparams_seed", "step", "val_acc", "test_acc", "job", "output_dir",
                  "hparams"]].reset_index(drop=True)


def _hparams_text_lines(table: pd.DataFrame, method: SelectionMethod) -> list[str]:
    rows = table[table["selection"] == method.key]
    head = ["Dataset", "Algorithm", "Test env", "Trial", "hparams_seed", "Step", "Val acc",
            "Test acc", "Job", "hparams"]
    body = [[r.dataset, r.algorithm, f"{r.test_env_label} ({r.test_env})", r.trial_seed,
             r.hparams_seed, r.step, _percent(r.val_acc), _percent(r.test_acc), r.job, r.hparams]
            for r in rows.itertuples()]
    body = [[str(v) for v in row] for row in [head, *body]]
    widths = [max(len(row[i]) for row in body) for i in range(len(head) - 1)]
    return [f"-------- Selected hparams, model selection method: {method.name}"] + [
        "  ".join(v.ljust(w) for v, w in zip(row, widths)) + "  " + row[-1] for row in body]


def _percent(value) -> str:
    return "X" if value is None or np.isnan(value) else f"{100 * value:.1f}"


# --------------------------------------------------------------------------------------------------
# Rendering


def _text_table(table: Table, latex: bool) -> list[str]:
    """DomainBed's ``print_table`` (spec 9.5)."""
    style = "latex" if latex else "text"
    lines = [""]
    if latex:
        lines += ["\\begin{center}", "\\adjustbox{max width=\\textwidth}{%",
                  "\\begin{tabular}{l" + "c" * len(table.col_labels) + "}", "\\toprule"]
        labels = ["\\textbf{" + str(label).replace("%", "\\%") + "}"
                  for label in ["Algorithm", *table.col_labels]]
    else:
        lines.append(f"-------- {table.header}")
        labels = ["Algorithm", *table.col_labels]
    lines.append(format_row(labels, table.colwidth, latex))
    if latex:
        lines.append("\\midrule")
    for algorithm, cells in table.rows.items():
        row = [algorithm, *(cell.text(style) for cell in cells)]
        lines.append(format_row(row, table.colwidth, latex))
    if latex:
        lines += ["\\bottomrule", "\\end{tabular}}", "\\end{center}"]
    return lines


def _markdown_table(table: Table) -> list[str]:
    def escape(value) -> str:
        return str(value).replace("|", "\\|")

    return ["", f"### {table.header}", "",
            "| " + " | ".join(escape(v) for v in ["Algorithm", *table.col_labels]) + " |",
            "|:--" + "|--:" * len(table.col_labels) + "|"] + [
        "| " + " | ".join([escape(a), *(c.text("markdown") for c in cells)]) + " |"
        for a, cells in table.rows.items()]


@dataclass
class Report:
    """Everything collect_results prints: the standard tables of each method, then the
    IP/OOP tables (if any), then optionally the selected hparams."""

    n_records: int
    sections: list[tuple[SelectionMethod, str, str, list[Table]]] = field(default_factory=list)
    hparams: pd.DataFrame | None = None


def build_report(records: pd.DataFrame, methods: list[SelectionMethod],
                 hparams_table: bool = False, single_source: str = "auto") -> Report:
    """Select and tabulate: the standard tables per method, then the subset keys' tables, then
    single-source tables (``single_source``: ``auto`` where unambiguous, ``on``, ``off``; see
    :mod:`dg_plugins.engine.single_source`)."""
    from dg_plugins.engine import single_source as sdg

    grouped = group_records(records)
    report = Report(len(grouped.records))
    for method in methods:
        report.sections.append((method, TEST_KEY, "", results_tables(grouped, method)))
    for key, label, description in subset_keys(grouped.records):
        for method in methods:
            report.sections.append((method, key, f"{label}: {description}",
                                    results_tables(grouped, method, key)))
    if single_source != "off":
        datasets = sdg.single_source_datasets(grouped) if single_source == "auto" else None
        for method in [m for m in methods if m in sdg.METHODS]:
            tables = sdg.single_source_tables(grouped, method, datasets)
            if tables:
                report.sections.append((method, "single_source", sdg.DESCRIPTION, tables))
    if hparams_table:
        report.hparams = selected_hparams(grouped, methods)
    return report


def render(report: Report, fmt: str = "text") -> str:
    """The report as printed (and written to :data:`RESULTS_FILES`); ``text``/``latex`` match
    DomainBed's collect_results byte for byte when there are no subset keys and no hparams
    table."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt == "csv":
        return _render_csv(report)
    lines: list[str] = []
    if fmt == "latex":
        lines += ["\\documentclass{article}", "\\usepackage{booktabs}", "\\usepackage{adjustbox}",
                  "\\begin{document}", "\\section{Full DomainBed results}",
                  f"% Total records: {report.n_records}"]
    elif fmt == "markdown":
        lines += ["# Results", "", f"Total records: {report.n_records}"]
    else:
        lines.append(f"Total records: {report.n_records}")
    for method, _key, subset, tables in report.sections:
        title = f"Model selection: {method.name}" + (f" ({subset})" if subset else "")
        if fmt == "latex":
            lines += ["", f"\\subsection{{{title}}}"]
        elif fmt == "markdown":
            lines += ["", f"## {title}"]
        for table in tables:
            if fmt == "latex":
                lines += ["", f"\\subsubsection{{{table.title}}}"]
                lines += _text_table(table, latex=True)
            elif fmt == "markdown":
                lines += _markdown_table(table)
            else:
                lines += _text_table(table, latex=False)
    if report.hparams is not None:
        lines += _render_hparams(report, fmt)
    if fmt == "latex":
        lines.append("\\end{document}")
    return "\n".join(lines) + "\n"


def _render_hparams(report: Report, fmt: str) -> list[str]:
    methods = list(dict.fromkeys(m for m, _, _, _ in report.sections))
    lines = []
    if fmt == "latex":
        lines += ["", "\\subsection{Selected hparams}", "\\begin{verbatim}"]
    elif fmt == "markdown":
        lines += ["", "## Selected hparams", "", "```"]
    for method in methods:
        lines += [""] + _hparams_text_lines(report.hparams, method)
    if fmt == "latex":
        lines.append("\\end{verbatim}")
    elif fmt == "markdown":
        lines.append("```")
    return lines


def tidy_cells(report: Report) -> pd.DataFrame:
    """Every cell of every table, one row each (the ``csv`` format's columns)."""
    rows = []
    for method, key, _subset, tables in report.sections:
        for table in tables:
            for algorithm, cells in table.rows.items():
                for column, cell in zip(table.col_labels, cells):
                    rows.append((method.key, method.name, key, table.title, algorithm, column,
                                 cell.mean, cell.err, cell.n, cell.text("csv")))
    return pd.DataFrame(rows, columns=["selection", "selection_name", "test_key", "table",
                                       "algorithm", "column", "mean", "err", "n", "text"])


def _render_csv(report: Report) -> str:
    cells = tidy_cells(report)
    cells["n"] = cells["n"].astype("Int64")
    text = cells.to_csv(index=False, lineterminator="\n", float_format="%.10g")
    if report.hparams is not None:
        text += "\n" + report.hparams.to_csv(index=False, lineterminator="\n")
    return text


def hparams_csv(report: Report) -> str:
    return report.hparams.to_csv(index=False, lineterminator="\n")
