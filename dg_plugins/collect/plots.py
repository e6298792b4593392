"""Figures of a sweep's results (``collect_results --plot DIR``) from what the tables are printed
from: accuracy bars per table; training curves per dataset and algorithm, read from each section's
Selection (docs/collect.md). matplotlib loads only to draw, on its Agg canvas."""

from __future__ import annotations

import io
import math
import os
import re
import textwrap
from functools import cache, partial
from typing import Iterator

import numpy as np
import pandas as pd

from dg_plugins import catalog
from dg_plugins.collect.report import nonfinite_by_job
from dg_plugins.collect.selection import TEST_KEY
from dg_plugins.collect.single_source import SINGLE_SOURCE_KEY
from dg_plugins.collect.tables import Cell, Report, Section, Table, environment_labels
from dg_plugins.collect.udg import UDG_KEY, fraction_label, is_udg

DPI = 100  # a point is 100/72 pixels
SMALL, NORMAL = 8, 9  # font sizes (points): no text is smaller than SMALL
MAX_WIDTH = 12.0  # inches: 1,200 pixels
#: :func:`curve_points`' frames: every record of the chosen runs (``signal``: what the method
#: selects with; ``order`` sorts the panels), and each chosen checkpoint (``score``: its signal).
POINT_COLUMNS = ["method", "dataset", "algorithm", "panel", "order", "trial_seed", "step",
                 "signal", "target", "job"]
SELECTED_COLUMNS = ["method", "dataset", "algorithm", "panel", "trial_seed", "step", "score",
                    "target"]
#: Per kind of run: the curves' file name suffix, what their title adds, the bars' x label.
KINDS = {TEST_KEY: ("", "", "test domain"),
         SINGLE_SOURCE_KEY: ("_single_source", ", single-source runs (target: mean over the "
                             "targets)", "target domain (the source's bar: its validation "
                             "accuracy)"),
         UDG_KEY: ("_udg", ", UDG runs (target: mean over the targets)", "target domain")}
#: What each method selects with, per kind of run (the curve drawn beside the target's).
SIGNALS = {
    (TEST_KEY, "iid"): "source validation (mean out-split of the training domains)",
    (TEST_KEY, "loo"): "held-out accuracy of the runs tested on [t, j] (mean over j)",
    (TEST_KEY, "oracle"): "target out-split",
    (SINGLE_SOURCE_KEY, "iid"): "source out-split",
    (SINGLE_SOURCE_KEY, "oracle"): "targets' out-split (mean)",
    (UDG_KEY, "iid"): "sources' out-split (mean)",
    (UDG_KEY, "oracle"): "targets' out-split (mean)",
}
#: How each method picks, for the curves' caption.
RULES = {
    "iid": "iid (training-domain validation): each run's checkpoint with the best signal, then "
           "the run whose checkpoint scores best",
    "loo": "loo (leave-one-domain-out): each run's step with the best signal, then the best run",
    "oracle": "oracle (DomainBed's OracleSelectionMethod): each run's last checkpoint, no early "
              "stopping; the run (hparams) whose last checkpoint has the best signal",
}
SIGNAL_COLORS = {"iid": "C0", "loo": "C4", "oracle": "C2"}


def _safe(text) -> str:
    """A file-name part: characters other than letters, digits, ``.``, ``-``, ``+`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(text)).strip("_") or "_"


def figure_name(section: Section, table: Table) -> str:
    """The bar chart's file name: ``<dataset>[_source-<env>|_udg-<targets>]_accuracy_<method>
    [_<test key>].png``, ``averages_accuracy_<method>...`` for the Averages table."""
    if table.dataset is None:
        where = "averages"
    elif section.test_key == SINGLE_SOURCE_KEY:
        where = f"{_safe(table.dataset)}_source-{_safe(table.source)}"
    elif section.test_key == UDG_KEY:
        where = f"{_safe(table.dataset)}_udg-{'-'.join(_safe(k) for k in table.keys[:-1])}"
    else:
        where = _safe(table.dataset)
    key = section.test_key  # env{t}_in_ip_acc -> _in_ip
    suffix = "" if key in KINDS else "_" + _safe(key.replace("env{t}_", "").removesuffix("_acc"))
    return f"{where}_accuracy_{_safe(section.method.key)}{suffix}.png"


def _new_figure(width: float, height: float):
    """A Figure on an Agg canvas (collect_results without --plot never imports matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def _wrap(text: str, width: float, fontsize: float = SMALL) -> tuple[str, int]:
    """``text`` broken into lines that fit ``width`` inches at ``fontsize``, and their count."""
    characters = width * 72 / (0.52 * fontsize)
    text = "\n".join(textwrap.fill(part, max(20, int(characters * 0.92)),
                                   break_on_hyphens=False, break_long_words=False)
                     for part in text.split("\n"))
    return text, text.count("\n") + 1 if text else 0


def cell_label(cell: Cell) -> str:
    """``46.5 ± 1.6 (n=3)``, ``11.8 (n=1)`` (no error), ``78.3`` (no n), ``X``."""
    if cell.mean is None:
        return "X"
    if cell.n == 1:
        return f"{cell.mean:.1f} (n=1)"
    if cell.err is None or cell.n is None:
        return f"{cell.mean:.1f}"
    return f"{cell.mean:.1f} ± {cell.err:.1f} (n={cell.n})"


def chance_levels(records: pd.DataFrame) -> dict:
    """dataset -> 1 / classes (the records' ``num_classes``, else the catalogue's), where known."""
    chance = {}
    for dataset in dict.fromkeys(records["args.dataset"]):
        own = records.loc[records["args.dataset"] == dataset].get("num_classes", pd.Series())
        own = own[own > 0]  # NaN: not recorded
        classes = (float(own.mode().iloc[0]) if len(own) else None
                   ) or catalog.DATASET_CLASSES.get(dataset)
        if classes:
            chance[dataset] = 1.0 / classes
    return chance


def _chance_label(chance: float) -> str:
    return f"chance (1/{round(1 / chance)})"


def _averages_cells(section: Section, table: Table) -> dict[str, Cell]:
    """Per row, the Averages cell of ``table``'s dataset where it covers every environment."""
    averages = next((t for t in section.tables if t.dataset is None), None)
    if averages is None or table.dataset not in averages.keys or table.not_run:
        return {}
    column = averages.keys.index(table.dataset)
    every = tuple(range(len(table.keys) - 1))
    return {algorithm: cells[column] for algorithm, cells in averages.rows.items()
            if algorithm in table.rows and cells[column].err is not None
            and set(averages.coverage.get((algorithm, table.dataset), {}).values()) == {every}}


def accuracy_figure(section: Section, table: Table, chance: float | dict | None = None,
                    left_out: list[str] = ()):
    """The bar chart of one table; ``chance`` in [0, 1] (dataset -> chance for the Averages
    table). Artists carry gids (``<row>|<column key>``, ``<row>|err``, ``chance``, ...)."""
    keys = table.keys
    rows = [row for row, cells in table.rows.items() if any(c.mean is not None for c in cells)]
    empty = [row for row in table.rows if row not in rows]
    averages = _averages_cells(section, table) if section.test_key != UDG_KEY else {}
    n_rows = max(len(rows), 1)
    width = 0.8 / n_rows
    figure_width = min(MAX_WIDTH, max(6.5, 2.6 + len(keys) * (0.35 + 0.3 * n_rows)))
    centers = np.arange(len(keys), dtype=float)
    notes = ["Bars: the table's cells; error bars: standard error over trials (DomainBed's "
             "format_mean), n = trials in each bar; n=1: one trial, no error bar."]
    if averages:
        notes.append("Avg's error and n: the Averages table's cell (the per-trial average).")
    if any(cell.mean is None for row in rows for cell in table.rows[row]):
        notes.append("X: the table prints X (see collect_results' notes).")
    if empty:
        notes.append(f"Not drawn: {', '.join(empty)} (every cell X).")
    if table.left_out:
        notes.append(table.left_out[0].upper() + table.left_out[1:] + ".")
    notes += list(left_out)
    if chance:
        notes.append("Dashed: chance (1 / classes).")
    caption, caption_lines = _wrap(" ".join(notes), figure_width - 0.2)
    title, title_lines = _wrap(table.header, figure_width - 0.4, NORMAL + 1)
    height = 3.6 + 0.17 * (caption_lines + title_lines)
    figure = _new_figure(figure_width, height)
    ax = figure.subplots()
    positions = {row: centers - 0.4 + width * (k + 0.5) for k, row in enumerate(rows)}
    top = 100.0
    for k, (row, xs) in enumerate(positions.items()):
        cells = table.rows[row]
        present = [i for i, cell in enumerate(cells) if cell.mean is not None]
        bars = ax.bar(xs[present], [cells[i].mean for i in present], width * 0.92,
                      color=f"C{k % 10}", label=row if present else None)
        for i, patch in zip(present, bars.patches):
            patch.set_gid(f"{row}|{keys[i]}")
        shown = {i: averages[row] if keys[i] == "Avg" and cells[i].n is None and row in averages
                 else cells[i] for i in present}
        errors = {i: cell.err for i, cell in shown.items()
                  if cell.err is not None and cell.n is not None and cell.n > 1}
        if errors:
            bars_err = ax.errorbar(xs[list(errors)], [cells[i].mean for i in errors],
                                   yerr=list(errors.values()), fmt="none", ecolor="black",
                                   elinewidth=1, capsize=2)
            bars_err.lines[2][0].set_gid(f"{row}|err")
        for i, cell in shown.items():
            if cell.n is None:
                continue
            low = cells[i].mean - errors.get(i, 0.0)
            inside = low >= 14  # room under the error bar
            y = low - 1.0 if inside else cells[i].mean + errors.get(i, 0.0) + 1.0
            top = max(top, y + 9)
            ax.text(xs[i], y, f"n={cell.n}", ha="center", va="top" if inside else "bottom",
                    rotation=90, fontsize=SMALL, color="white" if inside else "black",
                    fontweight="bold" if inside else "normal", gid=f"{row}|{keys[i]}|n")
        for i, cell in enumerate(cells):
            if cell.mean is None:
                ax.text(xs[i], 1, "X", ha="center", va="bottom", fontsize=SMALL)
    marked = set()
    for comparison in table.comparisons:
        for row, paper_row in comparison.mapping.items():
            values = comparison.rows[paper_row]
            at = [i for i, value in enumerate(values) if value is not None]
            if row not in positions or not at:
                continue
            label = None if comparison.key in marked else f"paper [{comparison.key}]"
            marked.add(comparison.key)
            ax.plot(positions[row][at], [values[i].mean for i in at], "D", color="black",
                    markerfacecolor="white", markersize=5, linestyle="none", label=label,
                    gid=f"paper|{comparison.key}|{row}")
    if isinstance(chance, dict):
        at = [(i, chance[key]) for i, key in enumerate(keys) if key in chance]
        if at:
            ax.hlines([100 * c for _, c in at], [centers[i] - 0.45 for i, _ in at],
                      [centers[i] + 0.45 for i, _ in at], colors="0.3", linestyles="--",
                      linewidth=1, label="chance", gid="chance")
    elif chance:
        ax.axhline(100 * chance, color="0.3", linestyle="--", linewidth=1,
                   label=_chance_label(chance), gid="chance")
    ax.set_xticks(centers, table.col_labels, fontsize=NORMAL)
    ax.tick_params(axis="y", labelsize=NORMAL)
    ax.set_xlabel("dataset" if table.dataset is None else
                  KINDS.get(section.test_key, KINDS[TEST_KEY])[2], fontsize=NORMAL + 1)
    ax.set_ylabel("accuracy (%)", fontsize=NORMAL + 1)
    ax.set_ylim(0, top)
    ax.set_yticks(range(0, 101, 20))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(title, fontsize=NORMAL + 1)
    ax.legend(fontsize=NORMAL, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.text(0.01, 0.01, caption, fontsize=SMALL, color="0.2", va="bottom")
    figure.tight_layout(rect=(0, (0.1 + 0.16 * caption_lines) / height, 1, 1))
    return figure


def _panels(kind: str, frame: pd.DataFrame, labels_of) -> list[str]:
    """Each row's panel: ``target <env>``, ``source <env>``, ``<fraction> labels, targets ..``."""
    def label(dataset, env):
        return labels_of(dataset)[env] if env < len(labels_of(dataset)) else str(env)

    if kind == TEST_KEY:
        return [f"target {label(d, t)}" for d, t in zip(frame["dataset"], frame["test_env"])]
    if kind == SINGLE_SOURCE_KEY:
        return [f"source {labels_of(d)[s]}" for d, s in zip(frame["dataset"], frame["source"])]
    return [f"{fraction_label(f)} labels, targets {', '.join(label(d, t) for t in envs)}"
            for d, f, envs in zip(frame["dataset"], frame["label_fraction"], frame["test_envs"])]


def curve_points(frame: pd.DataFrame, report: Report, kind: str = TEST_KEY
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(points, selected)``: the records of the runs each method chose for sections of
    ``kind`` (read from their :class:`~dg_plugins.collect.selection.Selection`), and each chosen
    checkpoint; ``frame``: the records of that kind (UDG or not)."""
    labels_of = cache(partial(environment_labels, frame))
    parts, picks = [], []
    for section in [s for s in report.sections if s.test_key == kind] if len(frame) else []:
        selection = section.selection
        chosen = selection.chosen[selection.chosen["dataset"].isin(
            {table.dataset for table in section.tables})]
        if chosen.empty:
            continue
        order = (chosen["test_env"] if kind == TEST_KEY else chosen["source"]
                 if kind == SINGLE_SOURCE_KEY else pd.factorize(pd.Series(list(zip(
                     chosen["label_fraction"], chosen["test_envs"]))), sort=True)[0])
        chosen = chosen.assign(method=section.method.key, score=chosen["val_acc"], order=order,
                               panel=_panels(kind, chosen, labels_of))  # one per run
        points = selection.scored.merge(chosen[[*selection.run, "method", "order", "panel"]],
                                        on=selection.run)
        parts.append(points.assign(signal=points["val_acc"])[POINT_COLUMNS])
        picks.append(chosen[SELECTED_COLUMNS])
    if not parts:
        return pd.DataFrame(columns=POINT_COLUMNS), pd.DataFrame(columns=SELECTED_COLUMNS)
    return pd.concat(parts, ignore_index=True), pd.concat(picks, ignore_index=True)


def _cell_texts(report: Report, kind: str) -> dict:
    """(method key, dataset, algorithm, panel) -> the table cell, for the panels' titles."""
    texts = {}
    for section in [s for s in report.sections if s.test_key == kind]:
        for table in [t for t in section.tables if t.dataset is not None]:
            for row, cells in table.rows.items():
                head, of_key = (section.method.key, table.dataset), dict(zip(table.keys, cells))
                if kind == TEST_KEY:
                    texts.update({(*head, row, f"target {key}"): cell_label(cell)
                                  for key, cell in of_key.items() if key != "Avg"})
                    continue
                if "Avg" not in of_key:  # left out with the columns no run has: a plain title
                    continue
                avg = f"Avg {cell_label(of_key['Avg'])}"
                if kind == SINGLE_SOURCE_KEY:
                    texts[(*head, row, f"source {table.source}")] = avg
                else:
                    algorithm, fraction = row.rsplit(" ", 1)
                    texts[(*head, algorithm, f"{fraction} labels, targets "
                           f"{', '.join(table.keys[:-1])}")] = avg
    return texts


def nan_lines(nonfinite: dict, jobs) -> list[str]:
    """Caption lines naming the non-finite values of ``jobs``' records (``nonfinite``:
    :func:`~dg_plugins.collect.records.nonfinite_by_job`)."""
    jobs = set(jobs)
    found = {job: values for job, values in nonfinite.items() if job in jobs}
    if not found:
        return []
    parts = [f"job {job}: " + "; ".join(f"{what} at {steps}" for what, steps in values.items())
             for job, values in list(found.items())[:4]]
    more = f" and {len(found) - 4} more jobs" if len(found) > 4 else ""
    return [f"Non-finite values (a NaN accuracy is not drawn): {'; '.join(parts)}{more}."]


def curves_figure(points: pd.DataFrame, selected: pd.DataFrame, title: str, methods: list,
                  cell_texts: dict, kind: str, chance: float | None, ylim: tuple,
                  left_out: list[str]):
    """One dataset and algorithm's curves: a column per method, a row per panel. Artists carry
    gids ``<method>|<panel>|<what>``."""
    shown = [m for m in methods if (points["method"] == m.key).any()]
    panels = list(dict.fromkeys(points.sort_values("order", kind="stable")["panel"]))
    dataset, algorithm = points["dataset"].iloc[0], points["algorithm"].iloc[0]
    width = min(MAX_WIDTH, 1.4 + 3.5 * len(shown))
    notes = ["Lines: mean over trials; bands: lowest to highest trial. Each method's signal "
             "is what it selects with: " + "; ".join(RULES[m.key] for m in shown
                                                     if m.key in RULES) + "."]
    missing = [m for m in methods if m not in shown]
    if missing:
        notes.append("Not shown: " + ", ".join(m.key for m in missing)
                     + " (selected no run; see collect_results' notes).")
    notes += list(left_out)
    caption, caption_lines = _wrap(" ".join(notes), width - 0.2)
    heading, heading_lines = _wrap(title, width - 0.3, NORMAL + 1)
    bottom = 0.15 + 0.17 * caption_lines + 0.22 * 3 + 0.2  # 3 legend rows
    top = 0.12 + 0.17 * heading_lines
    height = top + 0.35 + 2.3 * len(panels) + bottom
    figure = _new_figure(width, height)
    axes = figure.subplots(len(panels), len(shown), squeeze=False, sharex=True, sharey=True)
    handles: dict = {}
    for c, method in enumerate(shown):
        signal_label = (f"{method.key}'s signal: "
                        f"{SIGNALS.get((kind, method.key), 'source validation')}")
        color = SIGNAL_COLORS.get(method.key, "C0")
        for r, panel in enumerate(panels):
            ax = axes[r][c]
            mine = points[(points["method"] == method.key) & (points["panel"] == panel)]
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=SMALL)
            if r == len(panels) - 1:
                ax.set_xlabel("step", fontsize=NORMAL)
            if c == 0:
                ax.set_ylabel(f"{panel}\naccuracy (%)", fontsize=NORMAL)
            cell = cell_texts.get((method.key, dataset, algorithm, panel))
            ax.set_title(("" if r else f"{method.name}\n") + (
                f"{panel}: no run selected" if mine.empty else
                f"{method.key} table: {cell}" if cell else panel), fontsize=NORMAL)
            if mine.empty:
                continue
            per_trial = mine.groupby(["trial_seed", "step"])[["signal", "target"]].mean()
            summary = per_trial.groupby("step").agg(["mean", "min", "max"])  # over trials
            steps = summary.index.to_numpy(dtype=float)
            for key, line_color, style, label in (
                    ("signal", color, "--", signal_label),
                    ("target", "C1", "-", "target in-split: the tables' test accuracy")):
                ax.fill_between(steps, 100 * summary[key, "min"], 100 * summary[key, "max"],
                                color=line_color, alpha=0.2, linewidth=0,
                                gid=f"{method.key}|{panel}|{key}_band")
                ax.plot(steps, 100 * summary[key, "mean"], style, color=line_color,
                        linewidth=1.3, marker="o", markersize=2.5, label=label,
                        gid=f"{method.key}|{panel}|{key}")
            picked = selected[(selected["method"] == method.key) & (selected["panel"] == panel)]
            ax.plot(picked["step"].to_numpy(dtype=float), 100 * picked["score"].to_numpy(float),
                    "o", markerfacecolor="none", markeredgecolor="black", markersize=6,
                    linestyle="none", label="selected checkpoint: the signal it was chosen by",
                    gid=f"{method.key}|{panel}|score")
            ax.plot(picked["step"].to_numpy(dtype=float), 100 * picked["target"].to_numpy(float),
                    "*", color="C3", markersize=9, linestyle="none",
                    label="selected checkpoint: its target accuracy (one star per trial)",
                    gid=f"{method.key}|{panel}|selected")
            if chance:
                ax.axhline(100 * chance, color="0.3", linestyle=":", linewidth=1.2,
                           label=_chance_label(chance), gid=f"{method.key}|{panel}|chance")
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
    axes[0][0].set_ylim(*ylim)
    order = sorted(handles, key=lambda label: next(
        (i for i, prefix in enumerate(_LEGEND_ORDER) if label.startswith(prefix)),
        len(_LEGEND_ORDER)))
    figure.legend([handles[label] for label in order], order, loc="lower center", ncol=2,
                  fontsize=SMALL, frameon=False,
                  bbox_to_anchor=(0.5, (0.1 + 0.17 * caption_lines) / height))
    figure.suptitle(heading, fontsize=NORMAL + 1, y=1 - 0.08 / height, va="top")
    figure.text(0.01, 0.1 / height, caption, fontsize=SMALL, color="0.2", va="bottom")
    figure.tight_layout(rect=(0, bottom / height, 1, 1))  # it makes room for the suptitle
    return figure


#: The curves' legend entries in order (by how they start).
_LEGEND_ORDER = ["target in-split", "iid", "loo", "oracle", "selected checkpoint: its",
                 "selected checkpoint", "chance"]


def _shared_ylim(values: np.ndarray, chance: float | None) -> tuple[float, float]:
    """A y range in percent over the finite ``values`` (in [0, 1]) and chance, on multiples of 5
    (leave-one-out's score is infinite where a step's first record counts one environment)."""
    values = [*100 * values[np.isfinite(values)], *([100 * chance] if chance else [])]
    low, high = min(values, default=0.0), max(values, default=100.0)
    return max(0.0, 5 * math.floor((low - 2) / 5)), min(100.0, 5 * math.ceil((high + 2) / 5))


def figures(records: pd.DataFrame, report: Report) -> Iterator[tuple[str, object]]:
    """``(file name, figure)`` of the report, drawn one at a time: bars, then curves."""
    chance, nonfinite = chance_levels(records), nonfinite_by_job(records)
    for section in report.sections:
        for table in section.tables:
            drawn = any(cell.mean is not None for cells in table.rows.values() for cell in cells)
            if drawn and (table.dataset is not None or len(table.keys) > 2):
                jobs = (records["job"] if table.dataset is None else
                        records.loc[records["args.dataset"] == table.dataset, "job"])
                yield figure_name(section, table), accuracy_figure(
                    section, table, chance if table.dataset is None else
                    chance.get(table.dataset), nan_lines(nonfinite, jobs))
    kinds, udg = {}, is_udg(records)
    for kind in (TEST_KEY, SINGLE_SOURCE_KEY, UDG_KEY):
        frame = records[udg if kind == UDG_KEY else ~udg].reset_index(drop=True)
        points, selected = curve_points(frame, report, kind)
        if not points.empty:
            kinds[kind] = points, selected
    ylims = {}
    for dataset in dict.fromkeys(d for points, _ in kinds.values() for d in points["dataset"]):
        values = np.concatenate([
            points.loc[points["dataset"] == dataset, ["signal", "target"]].to_numpy(float).ravel()
            for points, _ in kinds.values()])
        ylims[dataset] = _shared_ylim(values, chance.get(dataset))
    for kind, (points, selected) in kinds.items():
        methods = list(dict.fromkeys(s.method for s in report.sections if s.test_key == kind))
        texts = _cell_texts(report, kind)
        row_order = list(dict.fromkeys(
            row.rsplit(" ", 1)[0] if kind == UDG_KEY else row
            for s in report.sections if s.test_key == kind for t in s.tables for row in t.rows))
        for dataset, of_dataset in points.groupby("dataset", sort=False):
            algorithms = sorted(set(of_dataset["algorithm"]),
                                key=lambda a: (row_order.index(a) if a in row_order
                                               else len(row_order), str(a)))
            for algorithm in algorithms:
                mine = of_dataset[of_dataset["algorithm"] == algorithm]
                picks = selected[(selected["dataset"] == dataset)
                                 & (selected["algorithm"] == algorithm)]
                trials = mine["trial_seed"].nunique()
                title = (f"{dataset}, {algorithm}{KINDS[kind][1]}: the runs each selection method "
                         f"chose, against the training step ({trials} trial"
                         f"{'s' if trials != 1 else ''})")
                yield (f"{_safe(dataset)}_{_safe(algorithm)}{KINDS[kind][0]}_curves.png",
                       curves_figure(mine, picks, title, methods, texts, kind,
                                     chance.get(dataset), ylims[dataset],
                                     nan_lines(nonfinite, mine["job"])))


def save_png(figure, path: str) -> None:
    """The figure as a PNG with a 256-colour palette: about a third of the bytes of matplotlib's
    RGBA file, with no visible change to a plot's few colours."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(256).save(path, format="png", optimize=True)


def write_figures(records: pd.DataFrame, report: Report, out_dir: str) -> list[str]:
    """Draw :func:`figures` as PNGs into ``out_dir``; their paths (clashing names get ``-2``..)."""
    os.makedirs(out_dir, exist_ok=True)
    paths, taken = [], set()
    for name, figure in figures(records, report):
        (stem, ext), n = os.path.splitext(name), 1
        while name in taken:
            n += 1
            name = f"{stem}-{n}{ext}"
        taken.add(name)
        paths.append(os.path.join(out_dir, name))
        save_png(figure, paths[-1])
    return paths
