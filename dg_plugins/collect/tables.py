"""The table model, and the standard and IP/OOP tables as DomainBed's collect_results makes them
(``print_results_tables``, ``format_mean``), quirks kept; the run each group selected."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from dg_plugins import catalog
from dg_plugins.collect.records import acc_matrix
from dg_plugins.collect.ipoop import subset_keys
from dg_plugins.collect.selection import (TEST_KEY, GroupedRecords, Selection, SelectionMethod,
                                          group_records, leading_count, select,
                                          standard_selection)
from dg_plugins.reference.papers import PaperValue


@dataclass
class Cell:
    """A table cell: mean and error in percent (None when absent), number of trials."""

    mean: float | None = None
    err: float | None = None
    n: int | None = None

    @classmethod
    def of(cls, accuracies) -> Cell:
        """DomainBed's ``format_mean`` of accuracies in [0, 1]: the mean in percent and, as error,
        the population std of ``accuracies / sqrt(n)``; no values, no mean."""
        values = np.asarray(list(accuracies))
        if not len(values):
            return cls(n=0)
        return cls(100 * np.mean(values), 100 * np.std(values / np.sqrt(len(values))), len(values))

    @classmethod
    def average(cls, cells: list[Cell]) -> Cell:
        """``Avg``: the plain mean of the cells' means (no error, no n); absent if any is."""
        means = [cell.mean for cell in cells]
        if not means or any(mean is None for mean in means):
            return cls()
        return cls(sum(means) / len(means))

    def text(self, sign: str = "+/-") -> str:
        """``"20.0 +/- 4.7"`` (``sign`` between), ``"78.3"`` without error, ``"X"`` absent."""
        if self.mean is None:
            return "X"
        return f"{self.mean:.1f}" + ("" if self.err is None else f" {sign} {self.err:.1f}")


@dataclass
class PaperComparison:
    """A paper's rows under one table, with ours minus the paper's per column."""

    key: str
    heading: str
    details: str
    rows: dict[str, list[PaperValue | None]]
    mapping: dict[str, str]
    differences: dict[str, list[float | None]]
    claim: str | None = None


@dataclass
class Table:
    """One results table: ``rows`` algorithm -> cells; the rest for papers and notes."""

    title: str
    header: str
    col_labels: list[str]
    rows: dict[str, list[Cell]]
    colwidth: int
    dataset: str | None = None
    source: str | None = None
    keys: list[str] | None = None  # the columns' keys (default: their labels)
    coverage: dict | None = None
    comparisons: list[PaperComparison] = field(default_factory=list)
    not_run: tuple = ()
    left_out: str | None = None

    def __post_init__(self) -> None:
        self.keys = list(self.col_labels) if self.keys is None else self.keys

    def text_rows(self, sign: str = "+/-") -> list[list[str]]:
        """The rows as printed: ``[algorithm, *cell texts]`` (:meth:`Cell.text`)."""
        return [[row, *(cell.text(sign) for cell in cells)] for row, cells in self.rows.items()]


@dataclass
class Section:
    """The tables of one selection method for one test key, and the
    :class:`~dg_plugins.collect.selection.Selection` they and the figures read."""

    method: SelectionMethod
    test_key: str
    subtitle: str
    tables: list[Table]
    selection: Selection | None = None

    @property
    def title(self) -> str:
        return f"Model selection: {self.method.name}" + (
            f" ({self.subtitle})" if self.subtitle else "")


@dataclass
class Report:
    """Everything collect_results prints: the sections, then optionally selected hparams."""

    n_records: int
    methods: list[SelectionMethod]
    sections: list[Section] = field(default_factory=list)
    hparams: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)  # on stderr: stdout stays DomainBed's


def algorithm_order(grouped: GroupedRecords) -> list[str]:
    """Table rows: known algorithms in catalog order, then unknown ones by first appearance."""
    present = grouped.algorithms
    known, seen = set(catalog.ALGORITHM_ORDER), set(present)
    return [a for a in catalog.ALGORITHM_ORDER if a in seen] + [
        a for a in present if a not in known]


def dataset_order(grouped: GroupedRecords) -> list[str]:
    """Table order: catalog datasets in catalog order, then unknown ones alphabetically."""
    present = set(grouped.datasets)
    known = [d for d in catalog.DATASET_ENVIRONMENTS if d in present]
    return known + sorted(present - set(known), key=str)


def environment_count(records: pd.DataFrame) -> int:
    """The largest count of leading environments with an in or out accuracy."""
    present = (~np.isnan(acc_matrix(records, "env{t}_in_acc"))
               | ~np.isnan(acc_matrix(records, "env{t}_out_acc")))
    return int(leading_count(present).max(initial=0))


def environment_labels(records: pd.DataFrame, dataset: str) -> list[str]:
    """A dataset's column labels: the catalog's, else its records' ``environments``, else 0..n-1."""
    if dataset in catalog.DATASET_ENVIRONMENTS:
        return [str(label) for label in catalog.DATASET_ENVIRONMENTS[dataset]]
    rows = records[records["args.dataset"] == dataset]
    count = environment_count(rows)
    if "environments" in rows:
        carried = rows["environments"].dropna()
        carried = carried[carried.map(len) == count]
        if len(carried):
            return list(carried.value_counts().index[0])
    return [str(i) for i in range(count)]


def _header(prefix: str, method: SelectionMethod, test_key: str, note: str | None) -> str:
    return f"{prefix}, model selection method: {method.name}" + ("" if test_key == TEST_KEY else (
        f", test accuracy: {test_key}" + (f" ({note})" if note else "")))


def standard_sections(grouped: GroupedRecords, methods: list[SelectionMethod],
                      ipoop: str = "both") -> list[Section]:
    """Per method the standard section, then per IP/OOP key found (:func:`ipoop.subset_keys`)
    and method the section of that key, each reading its method's Selection."""
    selections = {method: standard_selection(grouped, method) for method in methods}
    ran: dict = {}  # dataset -> the environments some run has as its one test environment
    if selections:
        scored = next(iter(selections.values())).scored
        for dataset, env in zip(scored["dataset"], scored["test_env"]):
            ran.setdefault(dataset, set()).add(int(env))
    keys = [(TEST_KEY, "", None), *subset_keys(grouped.records, ipoop)]
    return [Section(method, key, subtitle,
                    _results_tables(grouped, method, selection, key, ran, note), selection)
            for key, subtitle, note in keys for method, selection in selections.items()]


def _results_tables(grouped: GroupedRecords, method: SelectionMethod, selection: Selection,
                    test_key: str, ran: dict, header_note: str | None) -> list[Table]:
    """The dataset tables and the Averages table of one method, test accuracy ``test_key``."""
    chosen = selection.chosen if test_key == TEST_KEY else select(grouped, method, test_key)
    # DomainBed drops groups without a test accuracy
    chosen = chosen[~np.isnan(chosen["test_acc"].to_numpy(dtype=float))].reset_index(drop=True)
    algorithms, datasets = algorithm_order(grouped), dataset_order(grouped)
    # Accuracies per cell, in group order (first appearance), as DomainBed lists them.
    per_cell = {key: list(values) for key, values in
                chosen.groupby(["dataset", "algorithm", "test_env"], sort=False)["test_acc"]}
    # Averages: per trial (sorted), the mean over the test environments that trial has.
    per_trial: dict = {}  # (algorithm, dataset) -> the trials' means
    coverage: dict = {}  # (algorithm, dataset) -> {trial: its test environments}
    for (algorithm, dataset, trial), of_trial in chosen.groupby(
            ["algorithm", "dataset", "trial_seed"], sort=True):
        cell = (algorithm, dataset)
        per_trial.setdefault(cell, []).append(float(np.mean(list(of_trial["test_acc"]))))
        coverage.setdefault(cell, {})[trial] = tuple(sorted(of_trial["test_env"].tolist()))

    tables = []
    for dataset in datasets:
        labels = environment_labels(grouped.records, dataset)
        rows = {}
        for algorithm in algorithms:
            cells = [Cell.of(per_cell.get((dataset, algorithm, env), []))
                     for env in range(len(labels))]
            rows[algorithm] = cells + [Cell.average(cells)]
        not_run = tuple(label for env, label in enumerate(labels)
                        if env not in ran.get(dataset, ()))
        tables.append(Table(dataset, _header(f"Dataset: {dataset}", method, test_key, header_note),
                            [*labels, "Avg"], rows, 20, dataset=dataset, not_run=not_run))
    rows = {}
    for algorithm in algorithms:
        cells = [Cell.of(per_trial.get((algorithm, ds), [])) for ds in datasets]
        rows[algorithm] = cells + [Cell.average(cells)]
    tables.append(Table("Averages", _header("Averages", method, test_key, header_note),
                        [*datasets, "Avg"], rows, 25, coverage=coverage,
                        not_run=tuple(d for d in datasets if d not in ran)))
    return tables


def leave_out_unrun(report: Report) -> Report:
    """``report`` without the columns no run has (and their Avg), each such table saying so."""
    sections = [replace(section, tables=[_without_unrun(t) for t in section.tables])
                for section in report.sections]
    return replace(report, sections=sections)


def _without_unrun(table: Table) -> Table:
    if not table.not_run:
        return table
    keep = [i for i, key in enumerate(table.keys) if key not in table.not_run and key != "Avg"]
    what = "test environment" if table.dataset is not None else "dataset"
    names = ", ".join(map(str, table.not_run))
    avg = " and Avg (it needs every one)" if "Avg" in table.keys and keep else ""
    if keep:
        why = "not run" if table.dataset is not None else "no single-test-environment run"
        line = f"left out: {what}{'s' * (len(table.not_run) > 1)} {names} ({why}){avg}"
    else:
        line = (f"no column: no run of {names if table.dataset is None else table.dataset} has a "
                "single test environment")
    line += "; --all_columns shows them as X"

    def pick(values):
        return [values[i] for i in keep]

    comparisons = [replace(c, rows={name: pick(v) for name, v in c.rows.items()},
                           differences={name: pick(v) for name, v in c.differences.items()})
                   for c in table.comparisons]
    return replace(table, col_labels=pick(table.col_labels), keys=pick(table.keys),
                   rows={row: pick(cells) for row, cells in table.rows.items()},
                   comparisons=comparisons, left_out=line)


def selected_hparams(records: pd.DataFrame | GroupedRecords,
                     methods: list[SelectionMethod]) -> pd.DataFrame:
    """One row per (method, dataset, algorithm, test_env, trial) with the chosen run."""
    grouped = group_records(records)
    frame = grouped.records
    algorithms, datasets = algorithm_order(grouped), dataset_order(grouped)
    labels = {d: environment_labels(frame, d) for d in datasets}
    if not methods:
        return pd.DataFrame()
    table = pd.concat([select(grouped, method).assign(selection=method.key)
                       for method in methods], ignore_index=True)
    rec, rank = frame.iloc[table["record"].to_numpy()], {m.key: i for i, m in enumerate(methods)}
    table = table.assign(
        job=rec["job"].to_numpy(), output_dir=rec["args.output_dir"].to_numpy(),
        hparams=[json.dumps(h, sort_keys=True) for h in rec["hparams"]],
        test_env_label=[labels[d][t] if t < len(labels[d]) else str(t)
                        for d, t in zip(table["dataset"], table["test_env"])],
        _m=table["selection"].map(rank), _d=table["dataset"].map(datasets.index),
        _a=table["algorithm"].map(algorithms.index),
    ).sort_values(["_m", "_d", "_a", "test_env", "trial_seed"], kind="stable")
    return table[["selection", "dataset", "algorithm", "test_env", "test_env_label", "trial_seed",
                  "hparams_seed", "step", "val_acc", "test_acc", "job", "output_dir",
                  "hparams"]].reset_index(drop=True)
