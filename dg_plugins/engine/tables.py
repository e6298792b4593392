"""Results tables: DomainBed's collect_results output, byte for byte, plus Markdown, CSV, IP/OOP,
single-source and selected-hparams tables (``print_results_tables`` of
``domainbed/scripts/collect_results.py``, with ``format_mean`` and ``print_table`` of
``domainbed/lib/misc.py``).

Structure: selection modules choose runs (:mod:`dg_plugins.engine.selection` for DomainBed's
methods, :mod:`dg_plugins.engine.single_source` for single-source runs); this module turns their
choices into :class:`Table` objects and groups them into a :class:`Report` of :class:`Section`
(one method and test key each; :func:`build_report`); :mod:`dg_plugins.engine.table_formats`
renders a report in DomainBed's text and LaTeX, Markdown or CSV. Imports go
one way: tables -> single_source -> selection -> records. A new kind of table (say, one row per
algorithm and label fraction) is a selection function in a lower module, a ``..._tables`` function
here like :func:`single_source_tables`, and one more :class:`Section` in :func:`build_report`.

Per selection method: one table per dataset (rows: algorithms; columns: the dataset's environments
and ``Avg``) and an Averages table (columns: datasets and ``Avg``). A cell (:meth:`Cell.of`) is
DomainBed's ``format_mean`` over trial seeds of the groups' selected test accuracies; ``Avg`` is the
plain mean of the row's cell means, or ``X`` when a cell is missing (:meth:`Cell.average`).
DomainBed's quirks are kept: the population std divided by sqrt(n) as error, the Averages table
averaging each trial over whatever test environments it has (a dataset can show ``X`` in its own
table and a number in the Averages), ``print_row``'s truncation of every cell to the column width
and its trailing space (text) or `` \\\\`` (LaTeX).

Ordering: algorithms in :data:`dg_plugins.catalog.ALGORITHM_ORDER` order, then unknown ones by
first appearance in the records (as DomainBed); datasets in
:data:`dg_plugins.catalog.DATASET_ENVIRONMENTS` order. Unlike DomainBed, which silently drops a
dataset it does not know, unknown datasets follow the known ones in alphabetical order, their
environment columns labelled ``0, 1, ...`` (the environment count read from the records'
``env{i}_in_acc`` keys).

Extra test keys: :func:`subset_keys` finds ``env{i}_in_ip_acc`` / ``env{i}_in_oop_acc`` columns
(accuracy of the test environment's in split on its in-pretraining / out-of-pretraining subset);
their sections come after the standard ones, with the same selection (the run and checkpoint each
method picks) reporting that key instead of ``env{t}_in_acc``. With the subsets' sizes
(``env{i}_{in,out}_{ip,oop}_count``) the same subsets are also reported over the whole test
environment, in and out splits pooled (:func:`add_pooled_subsets`, keys
``env{t}_pooled_{ip,oop}_acc``); ``build_report(ipoop=...)`` shows the in split's, the pooled or
both (the default); each section's header names its key. Without such keys the output is exactly
DomainBed's.

Single-source tables (:func:`single_source_tables`), after those: laid out like GMoE's
single-source table (ICLR 2023, Table 3): per dataset, selection method and source, rows are
algorithms and columns the environments; the source's column holds its in-domain validation
accuracy (``env{s}_out_acc``, labelled ``<env> (source)``), every other column the target accuracy
(``env{t}_in_acc``), and ``Avg`` is the mean over the targets.

Selected hparams (:func:`selected_hparams`): per method, dataset, algorithm, test environment and
trial, the run the method chose (hparams_seed, step, val/test accuracy, job folder, hparams), in
``Report.hparams`` (rendered after the tables).

Paper numbers (:func:`add_paper_comparisons`, ``build_report(papers=...)``): each entry of
:mod:`dg_plugins.reference` goes under every table it matches (:func:`paper_matches`: the same
setting, the entry's dataset, source environment and selection method where it names them; a
several-dataset entry also under the Averages table), as a :class:`PaperComparison`: the paper's
rows under our columns and, for each algorithm of the table that corresponds to a paper row, ours
minus the paper's per column. An entry that matches no table becomes a note saying what it needs.

Notes (``Report.notes``; collect_results prints them on stderr): why dataset-table cells print X
(:func:`missing_cell_notes`: which test environments have single-test-environment records per
algorithm, or which runs the method lacks) and when an Averages cell is a mean over other test
environments than its dataset's columns or another row's (:func:`averages_notes`). They are
empty for a complete sweep, such as DomainBed's fixture.

API: ``build_report(records, methods, hparams_table, single_source, ipoop, papers) -> Report``,
``results_tables(records, method, test_key) -> [Table]``,
``single_source_tables(records, method, datasets) -> [Table]``, ``udg_tables(records, method) ->
[Table]``.

UDG tables (:func:`udg_tables`): records with ``args.label_fraction`` (the UDG protocol,
:mod:`dg_plugins.engine.udg_jobs`) are left out of every other table and reported, per selection method
that applies (training-domain validation on the sources' held-out data, oracle), in one table per
(dataset, test environment set): rows ``<algorithm> <label fraction>``, columns the target
environments and ``Avg`` (mean over the targets per trial, then mean +/- error over trials).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from dg_plugins import catalog
from dg_plugins.engine.records import acc_width, environment_count
from dg_plugins.reference import AVG, PaperEntry, PaperValue
from dg_plugins.engine.selection import (TEST_KEY, GroupedRecords, SelectionMethod, group_records,
                                         select, sweep_accs)
from dg_plugins.engine.single_source import METHODS as SINGLE_SOURCE_METHODS
from dg_plugins.engine.single_source import (select_single_source, single_source_datasets,
                                             single_source_runs)
from dg_plugins.engine.udg_selection import METHODS as UDG_METHODS
from dg_plugins.engine.udg_selection import is_udg, select_udg


class SubsetKey(NamedTuple):
    """An extra test key: its template (in ``t``), a short label and a description."""

    template: str
    label: str
    description: str


#: Extra test keys reported when present.
SUBSET_KEYS = (
    SubsetKey("env{t}_in_ip_acc", "IP", "in-pretraining subset of the test environment"),
    SubsetKey("env{t}_in_oop_acc", "OOP", "out-of-pretraining subset of the test environment"),
)
#: The same subsets over the whole test environment: its in and out splits pooled, each split's
#: subset accuracy weighted by the subset's size there (``env{i}_{in,out}_{ip,oop}_count``), as
#: the IP/OOP authors report each subset over the whole target domain.
POOLED_SUBSET_KEYS = (
    SubsetKey("env{t}_pooled_ip_acc", "IP, whole domain",
              "in-pretraining subset of the whole test environment (in and out splits pooled, "
              "weighted by their subset sizes)"),
    SubsetKey("env{t}_pooled_oop_acc", "OOP, whole domain",
              "out-of-pretraining subset of the whole test environment (in and out splits "
              "pooled, weighted by their subset sizes)"),
)
#: Which IP/OOP figures collect_results shows (``--ipoop``): the in split's, the pooled, or both.
IPOOP_CHOICES = ("in", "pooled", "both")
#: ``Section.test_key`` of single-source sections (source validation and target test accuracies).
SINGLE_SOURCE_KEY = "single_source"
SINGLE_SOURCE_DESCRIPTION = "single source: trained on one environment, tested on the others"
#: ``Section.test_key`` of UDG sections (dg_plugins.engine.udg_jobs).
UDG_KEY = "udg"
LOO_KEY = "loo"  # the --selection key of leave-one-domain-out (its X cells get their own note)
UDG_DESCRIPTION = ("UDG: self-supervised pretraining on the source domains, fine-tuning on a "
                   "labelled fraction")


# --------------------------------------------------------------------------------------------------
# Table model


@dataclass
class Cell:
    """A table cell: mean and error in percent (None when absent), number of trials."""

    mean: float | None = None
    err: float | None = None
    n: int | None = None

    @classmethod
    def of(cls, accuracies) -> Cell:
        """DomainBed's ``format_mean`` (``collect_results.py``) of accuracies in [0, 1]: the mean in percent
        and, as error, the population std of ``accuracies / sqrt(n)``; no values, no mean."""
        accuracies = list(accuracies)
        if not accuracies:
            return cls(n=0)
        mean = 100 * np.mean(accuracies)
        err = 100 * np.std(np.asarray(accuracies) / np.sqrt(len(accuracies)))
        return cls(mean, err, len(accuracies))

    @classmethod
    def average(cls, cells: list[Cell]) -> Cell:
        """``Avg``: the plain mean of the cells' means (no error, no n); absent if any is."""
        means = [cell.mean for cell in cells]
        if not means or any(mean is None for mean in means):
            return cls()
        return cls(sum(means) / len(means))

    def text(self, sign: str = "+/-") -> str:
        """``"20.0 +/- 4.7"`` (``sign`` between mean and error), ``"78.3"`` without error, ``"X"``
        when absent."""
        if self.mean is None:
            return "X"
        if self.err is None:
            return f"{self.mean:.1f}"
        return f"{self.mean:.1f} {sign} {self.err:.1f}"


@dataclass
class PaperComparison:
    """A paper's rows under one table (:func:`add_paper_comparisons`). ``key``: the entry's key in
    :mod:`dg_plugins.reference`; ``heading``: the citation, backbone, selection and source of
    the numbers; ``rows``: paper row -> one :class:`~dg_plugins.reference.PaperValue` or None
    (the paper gives no number there) per table column; ``details``: its backbone, selection and
    the text the numbers were read from; ``mapping``: each algorithm of the
    table that corresponds to a paper row -> that row; ``differences``: algorithm -> per column
    ours minus the paper's mean in points (None where either is absent); ``claim``: for an
    entry without numbers, what its source says instead."""

    key: str
    heading: str
    details: str
    rows: dict[str, list[PaperValue | None]]
    mapping: dict[str, str]
    differences: dict[str, list[float | None]]
    claim: str | None = None


@dataclass
class Table:
    """One results table. ``title`` names it (dataset, ``Averages``, ``<dataset>, source <env>``);
    ``header`` is the text format's header line; ``rows`` maps each algorithm to its cells (one
    per column label after ``Algorithm``); ``colwidth`` is DomainBed's print width.

    For paper comparisons and notes: ``dataset`` (None for the Averages table), ``source`` (the
    source environment's label, single-source tables), ``col_keys`` (the columns without
    decoration: environment labels or dataset names, and ``Avg``; default ``col_labels``),
    ``coverage`` (Averages tables: (algorithm, dataset) -> {trial_seed: the test environment
    indexes its mean is over}), ``comparisons`` (:class:`PaperComparison`, printed under it)."""

    title: str
    header: str
    col_labels: list[str]
    rows: dict[str, list[Cell]]
    colwidth: int
    dataset: str | None = None
    source: str | None = None
    col_keys: list[str] | None = None
    coverage: dict | None = None
    comparisons: list[PaperComparison] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return self.col_keys if self.col_keys is not None else self.col_labels


@dataclass
class Section:
    """The tables of one selection method for one test key. ``test_key``: :data:`TEST_KEY`, a
    :data:`SUBSET_KEYS` template or :data:`SINGLE_SOURCE_KEY`; ``subtitle``: empty for DomainBed's
    standard tables, else what the section shows (printed after the method name)."""

    method: SelectionMethod
    test_key: str
    subtitle: str
    tables: list[Table]

    @property
    def title(self) -> str:
        return f"Model selection: {self.method.name}" + (
            f" ({self.subtitle})" if self.subtitle else "")


@dataclass
class Report:
    """Everything collect_results prints: the sections (the standard tables of each method, then
    the IP/OOP and single-source ones, if any), then optionally the selected hparams of
    ``methods``."""

    n_records: int
    methods: list[SelectionMethod]
    sections: list[Section] = field(default_factory=list)
    hparams: pd.DataFrame | None = None
    #: What a reader needs to interpret the tables (X cells, averages over differing
    #: environments, paper entries without a matching table): collect_results prints them on
    #: stderr, so stdout stays DomainBed's tables.
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# Ordering


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
    """Column labels of a dataset: the catalog's; else the labels its records carry (their
    ``environments``: e.g. an ``ImageFolder`` tree's domain folders; the most common, when they
    fit the environment count); else ``0..n-1`` from its records' keys."""
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


# --------------------------------------------------------------------------------------------------
# Tables


#: What an IP/OOP table's header says after its key (which subset, over which split).
HEADER_NOTES = {
    "env{t}_in_ip_acc": "IP subset of the test environment's in split",
    "env{t}_in_oop_acc": "OOP subset of the test environment's in split",
    "env{t}_pooled_ip_acc": "IP subset of the whole test environment, in and out splits pooled",
    "env{t}_pooled_oop_acc": "OOP subset of the whole test environment, in and out splits pooled",
}


def _header(prefix: str, method: SelectionMethod, test_key: str) -> str:
    header = f"{prefix}, model selection method: {method.name}"
    if test_key != TEST_KEY:
        header += f", test accuracy: {test_key}"
        if test_key in HEADER_NOTES:
            header += f" ({HEADER_NOTES[test_key]})"
    return header


def results_tables(records: pd.DataFrame | GroupedRecords, method: SelectionMethod,
                   test_key: str = TEST_KEY) -> list[Table]:
    """The per-dataset tables and the Averages table of one method (``collect_results.print_results_tables``); the test
    accuracy of each chosen record is read with ``test_key`` (a template in ``t``)."""
    grouped = group_records(records)
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
        labels = environment_labels(grouped.records, dataset)
        rows = {}
        for algorithm in algorithms:
            cells = [Cell.of(per_cell.get((dataset, algorithm, env), []))
                     for env in range(len(labels))]
            rows[algorithm] = cells + [Cell.average(cells)]
        tables.append(Table(dataset, _header(f"Dataset: {dataset}", method, test_key),
                            [*labels, "Avg"], rows, 20, dataset=dataset))
    rows = {}
    for algorithm in algorithms:
        cells = [Cell.of([v for (a, d, _), v in per_trial.items() if (a, d) == (algorithm, ds)])
                 for ds in datasets]
        rows[algorithm] = cells + [Cell.average(cells)]
    coverage: dict = {}
    for (algorithm, dataset, trial), envs in chosen.groupby(
            ["algorithm", "dataset", "trial_seed"], sort=True)["test_env"]:
        coverage.setdefault((algorithm, dataset), {})[trial] = tuple(sorted(envs.tolist()))
    tables.append(Table("Averages", _header("Averages", method, test_key), [*datasets, "Avg"],
                        rows, 25, coverage=coverage))
    return tables


def add_pooled_subsets(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` with ``env{i}_pooled_{ip,oop}_acc`` columns (:data:`POOLED_SUBSET_KEYS`) added
    where the in and out splits' subset accuracies and counts exist: ``(acc_in * n_in + acc_out
    * n_out) / (n_in + n_out)``, an empty split (count 0, accuracy NaN) contributing nothing;
    NaN where a record lacks a count or both subsets are empty. The input is not modified."""
    added = {}
    for i in range(acc_width(records)):
        for subset in ("ip", "oop"):
            names = [f"env{i}_{split}_{subset}_{kind}" for kind in ("acc", "count")
                     for split in ("in", "out")]
            if not all(name in records.columns for name in names):
                continue
            acc_in, acc_out, n_in, n_out = (records[name].to_numpy(dtype=float) for name in names)
            total = n_in + n_out
            weighted = (np.where(n_in > 0, acc_in, 0.0) * n_in
                        + np.where(n_out > 0, acc_out, 0.0) * n_out)
            with np.errstate(invalid="ignore", divide="ignore"):
                added[f"env{i}_pooled_{subset}_acc"] = np.where(total > 0, weighted / total,
                                                                np.nan)
    return records.assign(**added) if added else records


def subset_keys(records: pd.DataFrame, ipoop: str = "both") -> list[SubsetKey]:
    """The IP/OOP keys whose column exists for some environment in ``records``: the in split's
    (:data:`SUBSET_KEYS`), the pooled ones (:data:`POOLED_SUBSET_KEYS`, see
    :func:`add_pooled_subsets`) or both, by ``ipoop`` (:data:`IPOOP_CHOICES`)."""
    if ipoop not in IPOOP_CHOICES:
        raise ValueError(f"ipoop must be one of {IPOOP_CHOICES}, not {ipoop!r}")
    keys = {"in": SUBSET_KEYS, "pooled": POOLED_SUBSET_KEYS,
            "both": SUBSET_KEYS + POOLED_SUBSET_KEYS}[ipoop]
    found = []
    for subset in keys:
        pattern = re.compile(re.escape(subset.template).replace(re.escape("{t}"), r"\d+"))
        if any(pattern.fullmatch(str(column)) for column in records.columns):
            found.append(subset)
    return found


def single_source_tables(records: pd.DataFrame | GroupedRecords, method: SelectionMethod,
                         datasets: list[str] | None = None) -> list[Table]:
    """One table per (dataset, source environment) of the single-source runs (module docstring;
    selection: :func:`dg_plugins.engine.single_source.select_single_source`), for ``datasets``
    (default: every dataset with single-source runs)."""
    if datasets is not None and not datasets:
        return []
    grouped = group_records(records)
    chosen = select_single_source(grouped, method)
    if datasets is None:
        datasets = sorted(set(chosen["dataset"]), key=str)
    algorithms = algorithm_order(grouped)
    tables = []
    for dataset in [d for d in dataset_order(grouped) if d in datasets]:
        labels = environment_labels(grouped.records, dataset)
        of_dataset = chosen[chosen["dataset"] == dataset]
        for source in sorted(set(of_dataset["source"].tolist())):
            at_source = of_dataset[of_dataset["source"] == source]
            rows = {}
            for algorithm in algorithms:
                mine = at_source[at_source["algorithm"] == algorithm]
                if mine.empty:
                    continue
                cells = [Cell.of(float(v) for v in mine[f"acc{i}"] if not np.isnan(v))
                         for i in range(len(labels))]
                rows[algorithm] = cells + [
                    Cell.average([c for i, c in enumerate(cells) if i != source])]
            col_labels = [f"{label} (source)" if i == source else label
                          for i, label in enumerate(labels)]
            header = (f"Dataset: {dataset}, single source: {labels[source]}, "
                      f"model selection method: {method.name}")
            tables.append(Table(f"{dataset}, source {labels[source]}", header,
                                [*col_labels, "Avg"], rows, 20, dataset=dataset,
                                source=labels[source], col_keys=[*labels, "Avg"]))
    return tables


def fraction_label(fraction: float) -> str:
    """``0.01`` -> ``1%``, ``1.0`` -> ``100%``."""
    return f"{100 * float(fraction):g}%"


def udg_tables(records: pd.DataFrame, method: SelectionMethod) -> list[Table]:
    """UDG tables (:mod:`dg_plugins.engine.udg_selection`): one per (dataset, test environment
    set); rows ``<algorithm> <label fraction>`` (algorithms in table order, fractions ascending),
    columns the target environments and ``Avg``. A target cell is the mean +/- error over trials
    of the chosen run's ``env{t}_in_acc`` (:meth:`Cell.of`); ``Avg`` is :meth:`Cell.of` of the
    per-trial mean over the targets (so it has an error bar too). ``records``: UDG records."""
    chosen = select_udg(records, method)
    if chosen.empty:
        return []
    algorithms = algorithm_order(records)
    tables = []
    for dataset in dataset_order(records):
        labels = environment_labels(records, dataset)
        of_dataset = chosen[chosen["dataset"] == dataset]
        for envs in sorted(set(of_dataset["test_envs"].tolist())):
            mine = of_dataset[of_dataset["test_envs"] == envs]
            names = [labels[t] if t < len(labels) else str(t) for t in envs]
            rows = {}
            for algorithm in algorithms:
                for fraction in sorted(set(mine.loc[mine["algorithm"] == algorithm,
                                                    "label_fraction"].tolist())):
                    runs = mine[(mine["algorithm"] == algorithm)
                                & (mine["label_fraction"] == fraction)]
                    accs = runs[[f"acc{t}" for t in envs]].to_numpy(dtype=float)
                    cells = [Cell.of(v for v in accs[:, i] if not np.isnan(v))
                             for i in range(len(envs))]
                    complete = accs[~np.isnan(accs).any(axis=1)]
                    rows[f"{algorithm} {fraction_label(fraction)}"] = cells + [
                        Cell.of(complete.mean(axis=1))]
            header = (f"Dataset: {dataset}, UDG, test environments: {', '.join(names)}, "
                      f"model selection method: {method.name}")
            tables.append(Table(f"{dataset}, UDG targets {', '.join(names)}", header,
                                [*names, "Avg"], rows, 20, dataset=dataset))
    return tables


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


# --------------------------------------------------------------------------------------------------
# Notes: what an X or an average is over (Report.notes)


def _names(labels: list[str], indexes) -> str:
    return ", ".join(labels[i] if i < len(labels) else str(i) for i in sorted(indexes))


def _listing(items: list[str], limit: int = 8) -> str:
    """``a, b, c`` (at most ``limit`` items, then ``and N more``)."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more"


def _envs(labels: list[str], indexes) -> str:
    """``test environment A`` / ``test environments A, C``."""
    plural = "s" if len(indexes) > 1 else ""
    return f"test environment{plural} {_names(labels, indexes)}"


def missing_cell_notes(grouped: GroupedRecords, sections: list[Section]) -> list[str]:
    """Why cells of the standard and IP/OOP dataset tables print ``X``: per dataset, the
    algorithms without a single-test-environment record for some of its environments (every
    method's table shows X there, and Avg is X for that row); per section, the X cells whose runs
    exist but which the method cannot score (leave-one-domain-out without the pair runs, a chosen
    record without the section's test key)."""
    single = grouped.single()
    info = grouped.groups.iloc[single["group"].to_numpy()]
    ran: dict[tuple, set] = {}
    for dataset, algorithm, env in zip(info["dataset"], info["algorithm"], info["test_env"]):
        ran.setdefault((dataset, algorithm), set()).add(int(env))
    present = set(zip(grouped.records["args.dataset"], grouped.records["args.algorithm"]))
    runs = single_source_runs(grouped)
    single_source = set(zip(runs["dataset"], runs["algorithm"])) if not runs.empty else set()
    notes, explained = [], set()
    for section in sections:
        if section.test_key in (SINGLE_SOURCE_KEY, UDG_KEY):
            continue
        unscored: dict[str, list[str]] = {}  # dataset -> "<algorithm> at <envs>"
        for table in section.tables:
            if table.dataset is None:
                continue
            labels = table.keys[:-1]
            full = set(range(len(labels)))
            not_run: dict[tuple, list[str]] = {}  # (envs with records, missing) -> algorithms
            for algorithm, cells in table.rows.items():
                missing = {i for i in full if cells[i].mean is None}
                have = ran.get((table.dataset, algorithm), set()) & full
                if missing - have:
                    not_run.setdefault((frozenset(have), frozenset(missing - have)),
                                       []).append(algorithm)
                if missing & have:
                    unscored.setdefault(table.dataset, []).append(
                        f"{algorithm} at {_names(labels, missing & have)}")
            if table.dataset in explained:
                continue
            explained.add(table.dataset)
            for (have, absent), algorithms in not_run.items():
                who = _listing(algorithms)
                if have:
                    why = (f"records exist only with {_envs(labels, have)}, none with "
                           f"{_names(labels, absent)}")
                elif not any((table.dataset, a) in present for a in algorithms):
                    why = "no record of theirs is on this dataset"
                elif all((table.dataset, a) in single_source for a in algorithms):
                    why = ("their runs on it are single-source (one training environment), "
                           "which these tables do not score: see the single-source tables")
                else:
                    why = "none of their records on it has a single test environment"
                notes.append(f"{table.dataset}: X for {who} in every method's table: {why}. "
                             "A row with an X has Avg X, as in DomainBed.")
        for dataset, cells in unscored.items():
            if section.method.key == LOO_KEY:
                why = ("leave-one-domain-out scores test environment t with the runs whose test "
                       "environments are [t, j], for every other environment j, at the same "
                       "hparams and steps, and those are missing (sweep launches them unless "
                       "--single_test_envs or --test_env_sets leaves them out)")
            else:
                why = f"the chosen records have no {section.test_key.format(t='<t>')}"
            notes.append(f"{dataset}, {section.title[len('Model selection: '):]}: X for "
                         f"{'; '.join(cells)} although those runs exist: {why}.")
    return notes


def averages_notes(sections: list[Section], labels_of) -> list[str]:
    """When an Averages cell is a mean over other test environments than its dataset's columns,
    or than another row's (DomainBed averages each trial over the test environments it has):
    one note per dataset and pattern, naming the methods it holds for. ``labels_of(dataset)``
    gives a dataset's environment labels."""
    bodies: dict[str, list[str]] = {}
    for section in sections:
        for table in section.tables:
            if table.coverage is None:
                continue
            for dataset in table.keys[:-1]:
                labels = labels_of(dataset)
                full = tuple(range(len(labels)))
                described = {}
                for algorithm in table.rows:
                    trials = table.coverage.get((algorithm, dataset))
                    if not trials:
                        continue
                    sets = sorted(set(trials.values()))
                    if len(sets) == 1:
                        described[algorithm] = _names(labels, sets[0])
                        continue
                    parts = []
                    for envs in sets:
                        seeds = sorted(t for t, e in trials.items() if e == envs)
                        parts.append((seeds, f"{_names(labels, envs)} (trial "
                                             f"{', '.join(map(str, seeds))})"))
                    described[algorithm] = " and ".join(text for _, text in sorted(parts))
                whole = _names(labels, full)
                if all(text == whole for text in described.values()):
                    continue
                groups: dict[str, list[str]] = {}
                for algorithm, text in described.items():
                    groups.setdefault(text, []).append(algorithm)
                parts = [f"{_listing(algorithms)} over {text}" for text, algorithms in
                         groups.items()]
                body = (f"Averages table, {dataset} column: DomainBed averages each trial over the "
                        f"test environments it has, here {'; '.join(parts)} (the dataset has "
                        f"{whole})")
                if len(groups) > 1:
                    body += ": these rows average different domains"
                elif described:
                    body += ", so it can show a number where the dataset's table prints X"
                bodies.setdefault(body, []).append(section.title[len("Model selection: "):])
    return [f"{body} [{'; '.join(dict.fromkeys(methods))}]." for body, methods in bodies.items()]


# --------------------------------------------------------------------------------------------------
# Paper numbers beside the tables (dg_plugins.reference)


def _section_setting(section: Section) -> str:
    if section.test_key == TEST_KEY:
        return "multi_source"
    if section.test_key == SINGLE_SOURCE_KEY:
        return "single_source"
    if section.test_key == UDG_KEY:
        return "udg"
    return "ipoop"


def _paper_heading(entry: PaperEntry) -> tuple[str, str]:
    """The comparison's two header lines: key and citation; backbone, selection and source."""
    selection = entry.selection_note if entry.selection is None else (
        f"{entry.selection} ({entry.selection_note})")
    return (f"paper [{entry.key}]: {entry.citation()}",
            f"  backbone: {entry.backbone}; selection: {selection}; numbers read from "
            f"{entry.read_from} ({entry.source_kind})")


def _paper_values(entry: PaperEntry, table: Table, row: str) -> list[PaperValue | None]:
    """The row's values under the table's columns."""
    cells = entry.rows[row]
    if entry.per_dataset:
        return [cells.get(key) for key in table.keys]
    if table.dataset is None:  # the Averages table: one column per dataset
        return [None if key == AVG else cells.get(key) for key in table.keys]
    return [cells.get(table.dataset) if key == AVG else None for key in table.keys]


def paper_matches(entry: PaperEntry, section: Section, table: Table) -> bool:
    """Whether ``entry`` belongs under ``table`` of ``section``: same setting, the entry's
    selection (if it names one), its dataset (the Averages table for a several-dataset entry
    with numbers) and, for single-source entries that name one, the source environment."""
    if _section_setting(section) != entry.setting:
        return False
    if entry.selection is not None and entry.selection != section.method.key:
        return False
    if table.dataset is None:
        return (table.coverage is not None and not entry.per_dataset and entry.available
                and any(key in entry.columns for key in table.keys))
    if table.dataset not in entry.datasets:
        return False
    return entry.source is None or entry.source == table.source


def paper_comparison(entry: PaperEntry, table: Table) -> PaperComparison:
    """The entry's rows under ``table``, with ours minus the paper's for every algorithm of the
    table that corresponds to a paper row."""
    rows = {row: _paper_values(entry, table, row) for row in entry.rows}
    mapping, differences = {}, {}
    for algorithm, cells in table.rows.items():
        row = entry.paper_row(algorithm)
        if row is None:
            continue
        mapping[algorithm] = row
        differences[algorithm] = [
            None if cell.mean is None or paper is None else cell.mean - paper.mean
            for cell, paper in zip(cells, rows[row])]
    return PaperComparison(entry.key, *_paper_heading(entry), rows, mapping, differences,
                           None if entry.available else entry.claim)


def add_paper_comparisons(report: Report, entries: list[PaperEntry]) -> list[str]:
    """Put each entry under every table it matches (:func:`paper_matches`); returns a note for
    each entry that matches none, saying which tables it needs."""
    notes = []
    for entry in entries:
        matched = False
        for section in report.sections:
            for table in section.tables:
                if paper_matches(entry, section, table):
                    table.comparisons.append(paper_comparison(entry, table))
                    matched = True
        if not matched:
            where = {"multi_source": "multi-source", "single_source": "single-source",
                     "udg": "UDG", "ipoop": "IP/OOP"}[entry.setting]
            needs = [f"{where} tables of {', '.join(entry.datasets)}"]
            if entry.source is not None:
                needs.append(f"source {entry.source}")
            if entry.selection is not None:
                needs.append(f"selection {entry.selection} (--selection {entry.selection})")
            notes.append(f"paper [{entry.key}]: no table here matches; it needs "
                         f"{', '.join(needs)}.")
    return notes


# --------------------------------------------------------------------------------------------------
# The report


def build_report(records: pd.DataFrame | GroupedRecords, methods: list[SelectionMethod],
                 hparams_table: bool = False, single_source: str = "auto",
                 ipoop: str = "both", papers: list[PaperEntry] = ()) -> Report:
    """Select and tabulate: the standard tables per method, then the IP/OOP subset keys' tables
    (``ipoop``: the in split's, the pooled whole-domain ones, or both; :func:`subset_keys`), then
    single-source tables (``single_source``: ``auto`` where unambiguous, see
    :func:`dg_plugins.engine.single_source.single_source_datasets`; ``on``; ``off``). ``papers``:
    entries of :mod:`dg_plugins.reference` to put under the tables they match
    (:func:`add_paper_comparisons`). ``Report.notes`` explains X cells and averages over
    differing environments (:func:`missing_cell_notes`, :func:`averages_notes`)."""
    if single_source not in ("auto", "on", "off"):
        raise ValueError(f"single_source must be auto, on or off, not {single_source!r}")
    if ipoop not in IPOOP_CHOICES:
        raise ValueError(f"ipoop must be one of {IPOOP_CHOICES}, not {ipoop!r}")
    methods = list(dict.fromkeys(methods))
    frame = records.records if isinstance(records, GroupedRecords) else records
    udg = is_udg(frame)
    if udg.any():  # UDG records get their own tables only (dg_plugins.engine.udg_jobs)
        udg_records = frame[udg].reset_index(drop=True)
        report = Report(len(frame), methods)
        if not udg.all():
            standard = _standard_report(frame[~udg].reset_index(drop=True), methods,
                                        hparams_table, single_source, ipoop)
            report.sections, report.hparams = standard.sections, standard.hparams
            report.notes = standard.notes
        for method in [m for m in methods if m in UDG_METHODS]:
            tables = udg_tables(udg_records, method)
            if tables:
                report.sections.append(Section(method, UDG_KEY, UDG_DESCRIPTION, tables))
    else:
        report = _standard_report(records, methods, hparams_table, single_source, ipoop)
    report.notes += add_paper_comparisons(report, list(papers))
    return report


def _standard_report(records: pd.DataFrame | GroupedRecords, methods: list[SelectionMethod],
                     hparams_table: bool, single_source: str, ipoop: str = "both") -> Report:
    if ipoop != "in":
        frame = records.records if isinstance(records, GroupedRecords) else records
        pooled = add_pooled_subsets(frame)
        records = records if pooled is frame else pooled
    grouped = group_records(records)
    report = Report(len(grouped.records), methods)
    for method in methods:
        report.sections.append(Section(method, TEST_KEY, "", results_tables(grouped, method)))
    for subset in subset_keys(grouped.records, ipoop):
        for method in methods:
            report.sections.append(Section(method, subset.template,
                                           f"{subset.label}: {subset.description}",
                                           results_tables(grouped, method, subset.template)))
    if single_source != "off":
        datasets = single_source_datasets(grouped) if single_source == "auto" else None
        for method in [m for m in methods if m in SINGLE_SOURCE_METHODS]:
            tables = single_source_tables(grouped, method, datasets)
            if tables:
                report.sections.append(Section(method, SINGLE_SOURCE_KEY,
                                               SINGLE_SOURCE_DESCRIPTION, tables))
    if hparams_table:
        report.hparams = selected_hparams(grouped, methods)
    report.notes += missing_cell_notes(grouped, report.sections)
    report.notes += averages_notes(report.sections,
                                   lambda dataset: environment_labels(grouped.records, dataset))
    return report
