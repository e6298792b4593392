"""Figures of a sweep's results (``collect_results --plot DIR``): PNGs drawn from the objects the
tables are printed from, so that every plotted number is a table's number.

* **Accuracy bars** (:func:`accuracy_figure`), one figure per dataset table of the report (per
  selection method and test key; single-source tables per source; UDG tables per target set;
  and the Averages table when it has several datasets): per column (environment, ``Avg``) one
  bar per table row at the cell's mean, its error bar the cell's standard error (DomainBed's
  ``format_mean``: population std / sqrt(trials)). A dataset table's ``Avg`` has no error of its
  own; its bar gets the error of the Averages table's cell for that dataset where that cell is a
  mean over every environment in every trial (then its mean is the same). An ``X`` cell gets no
  bar but an ``X``. Paper numbers (``collect_results --paper``, the rows that
  :func:`dg_plugins.collect.papers.add_paper_comparisons` puts under the table) are diamonds on
  the bars of the algorithms that correspond to a paper row.
* **Training curves** (:func:`curve_points`, :func:`curves_figure`), one figure per dataset and
  algorithm (for the standard, single-source and UDG runs separately): a row of panels per
  selection method, a panel per test environment (source environment, label fraction and target
  set). A panel shows, against the step, the source-validation accuracy (mean ``env{i}_out_acc``
  over the training environments, the training-domain validation score) and the target accuracy
  (``env{t}_in_acc``; single-source and UDG: the mean over the targets) of the runs the method
  chose, one per trial: the mean over trials, with a band from the lowest to the highest trial;
  each trial's selected checkpoint is a star on the target curve, and the panel's title gives the
  table cell those checkpoints make.

File names (:func:`figure_name`) are built from the table's dataset, source or targets,
selection key and test key (``PACS_accuracy_iid.png``, ``PACS_ERM_curves.png``, ...). Torch-free,
as collect_results is; matplotlib is imported when a figure is drawn, and draws with its Agg
canvas (no display, no pyplot state).
"""

from __future__ import annotations

import io
import os
import re
import textwrap
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd

from dg_plugins.collect.records import acc_matrix, leading_count
from dg_plugins.collect.selection import TEST_KEY, group_records, sweep_accs
from dg_plugins.collect.single_source import (SINGLE_SOURCE_KEY, select_single_source,
                                              single_source_runs)
from dg_plugins.collect.tables import Report, Section, Table, environment_labels
from dg_plugins.collect.udg import UDG_KEY, fraction_label, is_udg, select_udg

#: Resolution of the written PNGs.
DPI = 100
#: Columns of :func:`curve_points`' per-record frame (accuracies in [0, 1]; ``order`` sorts the
#: panels as the tables' columns).
POINT_COLUMNS = ["method", "dataset", "algorithm", "panel", "order", "trial_seed", "step", "val",
                 "target"]
#: Columns of its selected-checkpoint frame (one row per trial and panel).
SELECTED_COLUMNS = ["method", "dataset", "algorithm", "panel", "trial_seed", "step", "target"]
CURVE_KINDS = {TEST_KEY: "", SINGLE_SOURCE_KEY: "_single_source", UDG_KEY: "_udg"}


def _safe(text) -> str:
    """A file-name part: characters other than letters, digits, ``.``, ``-``, ``+`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(text)).strip("_") or "_"


def _test_key_suffix(test_key: str) -> str:
    """``env{t}_in_ip_acc`` -> ``_in_ip``; the standard test key -> ``""``."""
    if test_key in (TEST_KEY, SINGLE_SOURCE_KEY, UDG_KEY):
        return ""
    return "_" + _safe(test_key.replace("env{t}_", "").removesuffix("_acc"))


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
    return f"{where}_accuracy_{_safe(section.method.key)}{_test_key_suffix(section.test_key)}.png"


def curves_name(kind: str, dataset: str, algorithm: str) -> str:
    """``<dataset>_<algorithm>[_single_source|_udg]_curves.png``."""
    return f"{_safe(dataset)}_{_safe(algorithm)}{CURVE_KINDS[kind]}_curves.png"


def _new_figure(width: float, height: float):
    """A matplotlib Figure on an Agg canvas (imported here: collect_results without --plot never
    imports matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _wrap(text: str, figure, fontsize: float = 8) -> str:
    """``text`` broken into lines that fit the figure's width at ``fontsize``."""
    width = figure.get_figwidth() * 72 / (0.55 * fontsize)  # characters per line
    return textwrap.fill(text, max(20, int(width * 0.9)))


# --------------------------------------------------------------------------------------------------
# Accuracy bars


def _averages_errors(section: Section, table: Table) -> dict[str, float]:
    """Per row, the error of the Averages table's cell for ``table``'s dataset, where that cell
    is over every environment of the dataset in every trial (its mean is then the row's Avg)."""
    averages = next((t for t in section.tables if t.dataset is None), None)
    if averages is None or table.dataset not in averages.keys or averages.coverage is None:
        return {}
    column = averages.keys.index(table.dataset)
    every = tuple(range(len(table.keys) - 1))
    errors = {}
    for algorithm, cells in averages.rows.items():
        trials = averages.coverage.get((algorithm, table.dataset), {})
        if (algorithm in table.rows and trials and all(e == every for e in trials.values())
                and cells[column].err is not None):
            errors[algorithm] = cells[column].err
    return errors


def accuracy_figure(section: Section, table: Table):
    """The bar chart of one table (module docstring). Artists carry gids for readers: each bar
    ``<row>|<column key>``, each row's error bars ``<row>|err`` (a LineCollection, one segment
    per bar with an error, in column order), each paper marker line ``paper|<key>|<row>``."""
    keys, rows = table.keys, list(table.rows)
    avg_errors = _averages_errors(section, table) if section.test_key != UDG_KEY else {}
    n_rows = max(len(rows), 1)
    width = 0.8 / n_rows
    figure = _new_figure(max(5.0, 1.2 + len(keys) * (0.45 + 0.22 * n_rows)), 4.2)
    ax = figure.subplots()
    centers = np.arange(len(keys), dtype=float)
    positions = {}
    for k, row in enumerate(rows):
        cells = table.rows[row]
        xs = centers - 0.4 + width * (k + 0.5)
        positions[row] = xs
        present = [i for i, cell in enumerate(cells) if cell.mean is not None]
        bars = ax.bar(xs[present], [cells[i].mean for i in present], width * 0.92,
                      color=f"C{k % 10}", label=row if present else None)
        for i, patch in zip(present, bars.patches):
            patch.set_gid(f"{row}|{keys[i]}")
        errors = [(i, cells[i].err if cells[i].err is not None else
                   (avg_errors.get(row) if keys[i] == "Avg" else None)) for i in present]
        errors = [(i, err) for i, err in errors if err is not None]
        if errors:
            bars_err = ax.errorbar(xs[[i for i, _ in errors]], [cells[i].mean for i, _ in errors],
                                   yerr=[err for _, err in errors], fmt="none", ecolor="black",
                                   elinewidth=1, capsize=2)
            bars_err.lines[2][0].set_gid(f"{row}|err")
        for i, cell in enumerate(cells):
            if cell.mean is None:
                ax.text(xs[i], 1, "X", ha="center", va="bottom", fontsize=8)
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
    ax.set_xticks(centers, table.col_labels, fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(_wrap(table.header, figure), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    note = "error bars: standard error over trials"
    if avg_errors:
        note += "; Avg's: the Averages table's (of the per-trial average)"
    if any(cell.mean is None for cells in table.rows.values() for cell in cells):
        note += "; X: the table prints X"
    figure.text(0.01, 0.01, note, fontsize=6, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    return figure


# --------------------------------------------------------------------------------------------------
# Training curves of the selected runs


def _mean_over(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row means of ``values`` over ``mask``, skipping NaN (NaN where nothing is left)."""
    valid = mask & ~np.isnan(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(valid, values, 0.0).sum(axis=1) / valid.sum(axis=1)


def _standard_points(grouped, method, labels_of):
    """The single-test-environment runs each group's selection chose (:func:`sweep_accs`, the
    tables' selection): every record of the run, and the chosen checkpoint."""
    chosen = sweep_accs(grouped, method)
    if chosen.empty:
        return None
    single = grouped.single()
    runs = single.merge(chosen[["group", "hparams_seed", "trial_seed", "dataset", "algorithm"]],
                        on=["group", "hparams_seed"])
    rows = runs["record"].to_numpy()
    test_env = runs["test_env"].to_numpy()
    out = grouped.accs("env{t}_out_acc")[rows]
    sources = np.arange(out.shape[1])[None, :] < leading_count(~np.isnan(out))[:, None]
    sources &= np.arange(out.shape[1])[None, :] != test_env[:, None]
    inn = grouped.accs(TEST_KEY)
    points = runs.assign(val=_mean_over(out, sources), target=inn[rows, test_env],
                         order=test_env)
    for frame in (points, chosen):
        frame["panel"] = [f"target {labels_of(d)[t] if t < len(labels_of(d)) else t}"
                          for d, t in zip(frame["dataset"], frame["test_env"])]
    return points, chosen.rename(columns={"test_acc": "target"})


def _single_source_points(grouped, method, labels_of, datasets):
    chosen = select_single_source(grouped, method)
    chosen = chosen[chosen["dataset"].isin(datasets)].reset_index(drop=True)
    if chosen.empty:
        return None
    keys = ["trial_seed", "dataset", "algorithm", "source", "hparams_seed"]
    runs = single_source_runs(grouped).merge(chosen[keys], on=keys)
    rows, source = runs["record"].to_numpy(), runs["source"].to_numpy()
    out, inn = grouped.accs("env{t}_out_acc"), grouped.accs(TEST_KEY)
    columns = np.arange(inn.shape[1])[None, :]
    targets = (columns != source[:, None]) & (columns < runs["n_envs"].to_numpy()[:, None])
    points = runs.assign(val=out[rows, source], target=_mean_over(inn[rows], targets),
                         order=source)
    acc = chosen[[f"acc{i}" for i in range(inn.shape[1])]].to_numpy(dtype=float)
    chosen_targets = columns != chosen["source"].to_numpy()[:, None]
    chosen = chosen.assign(target=_mean_over(acc, chosen_targets))
    for frame in (points, chosen):
        frame["panel"] = [f"source {labels_of(d)[s]}" for d, s in
                          zip(frame["dataset"], frame["source"])]
    return points, chosen


def _udg_points(records, method, labels_of):
    chosen = select_udg(records, method)
    if chosen.empty:
        return None
    width = acc_matrix(records, "env{t}_out_acc").shape[1]
    runs = pd.DataFrame({
        "record": np.arange(len(records)),
        "trial_seed": records["args.trial_seed"].to_numpy(),
        "dataset": records["args.dataset"].to_numpy(),
        "algorithm": records["args.algorithm"].to_numpy(),
        "label_fraction": records["args.label_fraction"].astype(float).to_numpy(),
        "test_envs": records["args.test_envs"].to_numpy(),
        "hparams_seed": records["args.hparams_seed"].to_numpy(),
        "step": records["step"].to_numpy()})
    keys = ["trial_seed", "dataset", "algorithm", "label_fraction", "test_envs", "hparams_seed"]
    runs = runs.merge(chosen[keys], on=keys)
    out, inn = acc_matrix(records, "env{t}_out_acc"), acc_matrix(records, TEST_KEY)
    rows = runs["record"].to_numpy()
    targets = np.zeros((len(runs), width), dtype=bool)
    for i, envs in enumerate(runs["test_envs"]):
        targets[i, [e for e in envs if e < width]] = True
    inside = np.arange(width)[None, :] < leading_count(~np.isnan(out[rows]))[:, None]
    order = pd.factorize(pd.Series(list(zip(runs["label_fraction"], runs["test_envs"]))),
                         sort=True)[0]
    points = runs.assign(val=_mean_over(out[rows], inside & ~targets),
                         target=_mean_over(inn[rows], targets), order=order)
    acc = chosen[[f"acc{t}" for t in range(width)]].to_numpy(dtype=float)
    chosen = chosen.assign(target=_mean_over(acc, np.ones_like(acc, dtype=bool)))
    for frame in (points, chosen):
        frame["panel"] = [
            f"{fraction_label(f)} labels, targets "
            + ", ".join(labels_of(d)[t] if t < len(labels_of(d)) else str(t) for t in envs)
            for d, f, envs in zip(frame["dataset"], frame["label_fraction"], frame["test_envs"])]
    return points, chosen


def curve_points(records: pd.DataFrame, report: Report, kind: str = TEST_KEY
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The curves' data for the report's sections of ``kind`` (:data:`TEST_KEY`: the standard
    tables, :data:`SINGLE_SOURCE_KEY`, :data:`UDG_KEY`): ``(points, selected)``, the records of
    the runs each method chose (:data:`POINT_COLUMNS`: one row per record, ``val`` the source
    validation accuracy, ``target`` the target accuracy, in [0, 1]) and each chosen checkpoint
    (:data:`SELECTED_COLUMNS`: ``target`` is the accuracy the table's cell averages over
    trials). ``records``: as collect_results loads them (every kind mixed)."""
    udg = is_udg(records)
    frame = records[udg if kind == UDG_KEY else ~udg].reset_index(drop=True)
    sections = [s for s in report.sections if s.test_key == kind]
    if frame.empty or not sections:
        return pd.DataFrame(columns=POINT_COLUMNS), pd.DataFrame(columns=SELECTED_COLUMNS)
    labels = {}

    def labels_of(dataset):
        if dataset not in labels:
            labels[dataset] = environment_labels(frame, dataset)
        return labels[dataset]

    grouped = group_records(frame) if kind != UDG_KEY else None
    parts, picks = [], []
    for section in sections:
        if kind == TEST_KEY:
            found = _standard_points(grouped, section.method, labels_of)
        elif kind == SINGLE_SOURCE_KEY:
            found = _single_source_points(grouped, section.method, labels_of,
                                          {t.dataset for t in section.tables})
        else:
            found = _udg_points(frame, section.method, labels_of)
        if found is None:
            continue
        points, chosen = found
        parts.append(points.assign(method=section.method.key)[POINT_COLUMNS])
        picks.append(chosen.assign(method=section.method.key)[SELECTED_COLUMNS])
    if not parts:
        return pd.DataFrame(columns=POINT_COLUMNS), pd.DataFrame(columns=SELECTED_COLUMNS)
    return pd.concat(parts, ignore_index=True), pd.concat(picks, ignore_index=True)


def curve_summary(points: pd.DataFrame) -> pd.DataFrame:
    """Per step of one panel's ``points``: the mean, lowest and highest over trials of ``val``
    and ``target`` (a trial's records at one step are averaged first)."""
    per_trial = points.groupby(["trial_seed", "step"])[["val", "target"]].mean()
    summary = per_trial.groupby("step").agg(["mean", "min", "max"])
    summary.columns = [f"{key}_{stat}" for key, stat in summary.columns]
    return summary.reset_index()


def _cell_texts(report: Report, kind: str) -> dict:
    """(method key, dataset, algorithm, panel) -> the table cell's text, for the panels' titles:
    standard tables by environment column; single-source and UDG tables by their Avg (the mean
    over the targets; a UDG table's rows are ``<algorithm> <label fraction>``)."""
    texts = {}
    for section in report.sections:
        if section.test_key != kind:
            continue
        for table in section.tables:
            if table.dataset is None:
                continue
            for row, cells in table.rows.items():
                if kind == TEST_KEY:
                    for key, cell in zip(table.keys[:-1], cells):
                        texts[(section.method.key, table.dataset, row, f"target {key}")] = (
                            cell.text("±"))
                elif kind == SINGLE_SOURCE_KEY:
                    texts[(section.method.key, table.dataset, row, f"source {table.source}")] = (
                        f"Avg {cells[-1].text('±')}")
                else:
                    algorithm, fraction = row.rsplit(" ", 1)
                    panel = f"{fraction} labels, targets {', '.join(table.keys[:-1])}"
                    texts[(section.method.key, table.dataset, algorithm, panel)] = (
                        f"Avg {cells[-1].text('±')}")
    return texts


def curves_figure(points: pd.DataFrame, selected: pd.DataFrame, title: str,
                  methods: list, cell_texts: dict | None = None):
    """One dataset and algorithm's curves (module docstring): rows ``methods`` (SelectionMethod),
    columns the panels in order of appearance. Artists carry gids ``<method>|<panel>|<what>``,
    ``what`` one of ``val``/``target`` (mean lines, in percent), ``val_band``/``target_band``
    and ``selected`` (the stars)."""
    methods = [m for m in methods if (points["method"] == m.key).any()]
    panels = list(dict.fromkeys(points.sort_values("order", kind="stable")["panel"]))
    figure = _new_figure(max(7.0, 1.0 + 3.0 * len(panels)), 1.1 + 2.4 * len(methods))
    axes = figure.subplots(len(methods), len(panels), squeeze=False, sharex=True, sharey=True)
    dataset = points["dataset"].iloc[0]
    algorithm = points["algorithm"].iloc[0]
    handles = None
    for r, method in enumerate(methods):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            mine = points[(points["method"] == method.key) & (points["panel"] == panel)]
            ax.grid(alpha=0.3)
            if r == len(methods) - 1:
                ax.set_xlabel("step", fontsize=8)
            if c == 0:
                ax.set_ylabel(f"{method.key}\naccuracy (%)", fontsize=8)
            ax.tick_params(labelsize=7)
            if mine.empty:
                ax.set_title(f"{panel}: no run selected", fontsize=7)
                continue
            summary = curve_summary(mine)
            steps = summary["step"].to_numpy(dtype=float)
            for key, color, style, label in (
                    ("val", "C0", "--", "source validation"), ("target", "C1", "-", "target")):
                ax.fill_between(steps, 100 * summary[f"{key}_min"], 100 * summary[f"{key}_max"],
                                color=color, alpha=0.2, linewidth=0,
                                gid=f"{method.key}|{panel}|{key}_band")
                ax.plot(steps, 100 * summary[f"{key}_mean"], style, color=color, linewidth=1.3,
                        label=f"{label} (mean over trials)", gid=f"{method.key}|{panel}|{key}")
            picked = selected[(selected["method"] == method.key) & (selected["panel"] == panel)]
            ax.plot(picked["step"].to_numpy(dtype=float), 100 * picked["target"].to_numpy(float),
                    "*", color="C3", markersize=9, linestyle="none",
                    label="selected checkpoint (one per trial)",
                    gid=f"{method.key}|{panel}|selected")
            cell = (cell_texts or {}).get((method.key, dataset, algorithm, panel))
            ax.set_title(panel + (f"\n{method.key} table: {cell}" if cell else ""), fontsize=7)
            if handles is None:
                handles = ax.get_legend_handles_labels()
    if handles:
        figure.legend(*handles, loc="lower center", ncol=3, fontsize=7, frameon=False)
    figure.suptitle(_wrap(title, figure, 9), fontsize=9)
    figure.tight_layout(rect=(0, 0.06, 1, 0.97))
    return figure


# --------------------------------------------------------------------------------------------------
# All figures of a report


@dataclass
class NamedFigure:
    """A figure and its file name."""

    name: str
    figure: object


def figures(records: pd.DataFrame, report: Report) -> Iterator[NamedFigure]:
    """Every figure of the report, drawn one at a time: the bar charts in the tables' order
    (not of a table whose every cell is X, nor of an Averages table of one dataset), then the
    curves per kind, dataset and algorithm (in the tables' row order)."""
    for section in report.sections:
        for table in section.tables:
            drawn = any(cell.mean is not None for cells in table.rows.values() for cell in cells)
            if drawn and (table.dataset is not None or len(table.keys) > 2):
                yield NamedFigure(figure_name(section, table), accuracy_figure(section, table))
    for kind, what in ((TEST_KEY, ""),
                       (SINGLE_SOURCE_KEY, ", single-source runs (target: mean over the targets)"),
                       (UDG_KEY, ", UDG runs (target: mean over the targets)")):
        points, selected = curve_points(records, report, kind)
        if points.empty:
            continue
        methods = list(dict.fromkeys(s.method for s in report.sections if s.test_key == kind))
        texts = _cell_texts(report, kind)
        row_order = list(dict.fromkeys(
            row.rsplit(" ", 1)[0] if kind == UDG_KEY else row
            for s in report.sections if s.test_key == kind for t in s.tables for row in t.rows))
        for dataset in dict.fromkeys(points["dataset"]):
            of_dataset = points[points["dataset"] == dataset]
            algorithms = sorted(set(of_dataset["algorithm"]),
                                key=lambda a: (row_order.index(a) if a in row_order
                                               else len(row_order), str(a)))
            for algorithm in algorithms:
                mine = of_dataset[of_dataset["algorithm"] == algorithm]
                picks = selected[(selected["dataset"] == dataset)
                                 & (selected["algorithm"] == algorithm)]
                trials = mine["trial_seed"].nunique()
                title = (f"{dataset}, {algorithm}{what}: source validation and target accuracy "
                         f"of the selected runs against the step (mean over {trials} trial"
                         f"{'s' if trials != 1 else ''}; band: lowest to highest trial)")
                yield NamedFigure(curves_name(kind, dataset, algorithm),
                                  curves_figure(mine, picks, title, methods, texts))


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
    """Draw :func:`figures` into ``out_dir`` (created if needed) as PNGs; returns their paths,
    in drawing order. Two figures whose names collide get ``-2``, ``-3``, ... suffixes."""
    os.makedirs(out_dir, exist_ok=True)
    paths, taken = [], set()
    for named in figures(records, report):
        stem, ext = os.path.splitext(named.name)
        name, n = named.name, 1
        while name in taken:
            n += 1
            name = f"{stem}-{n}{ext}"
        taken.add(name)
        path = os.path.join(out_dir, name)
        save_png(named.figure, path)
        paths.append(path)
    return paths
