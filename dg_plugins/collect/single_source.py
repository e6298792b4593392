"""Single-source DG tables (``sweep --single_source``): their own Selection and tables, laid out
like GMoE's (ICLR 2023, Table 3) (docs/collect.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.collect.selection import (IID, ORACLE, GroupedRecords, Selection,
                                          SelectionMethod, group_records, masked_mean,
                                          select_by_masks)
from dg_plugins.job.selection import SELECTION_READS, single_source_of
from dg_plugins.collect.tables import (Cell, Section, Table, algorithm_order, dataset_order,
                                       environment_labels)

METHODS = (IID, ORACLE)  # LOO needs several sources
READS = SELECTION_READS["single_source"]
SINGLE_SOURCE_KEY = "single_source"
SINGLE_SOURCE_DESCRIPTION = "single source: trained on one environment, tested on the others"
RUN = ["trial_seed", "dataset", "algorithm", "source", "hparams_seed"]


def single_source_runs(grouped: GroupedRecords) -> pd.DataFrame:
    """The single-source records with their run columns and environment count."""
    records = grouped.records
    # The environment count, as both methods count it (every out-split: READS).
    n_envs = grouped.env_counts(READS[IID.key])
    # The source of each distinct (test_envs, environment count) pair, spread to the records.
    width = int(n_envs.max(initial=0)) + 1
    pairs, pair_of_record = np.unique(grouped.test_envs_code * width + n_envs, return_inverse=True)
    sources = np.array([single_source_of(grouped.distinct_test_envs[pair // width], pair % width)
                        for pair in pairs.tolist()], dtype=np.int64)[pair_of_record.ravel()]
    keep = np.flatnonzero(sources >= 0)
    return pd.DataFrame({"record": keep, **{  # RUN's columns
        name: (sources if name == "source" else records[f"args.{name}"].to_numpy())[keep]
        for name in RUN}, "step": records["step"].to_numpy()[keep], "n_envs": n_envs[keep]})


def single_source_datasets(records: pd.DataFrame | GroupedRecords,
                           runs: pd.DataFrame | None = None) -> list[str]:
    """Datasets whose single-source records are reported by default (docs/collect.md)."""
    grouped = group_records(records)
    runs = single_source_runs(grouped) if runs is None else runs
    singles = set(grouped.records["args.dataset"].to_numpy()[grouped.n_test_envs == 1])
    return [dataset for dataset, rows in runs.groupby("dataset", sort=False)
            if rows["n_envs"].max() >= 4 or dataset not in singles]


def single_source_selection(records: pd.DataFrame | GroupedRecords, method: SelectionMethod,
                            runs: pd.DataFrame | None = None) -> Selection:
    """The single-source :class:`Selection`: a group per (trial_seed, dataset, algorithm,
    source); ``chosen`` has ``acc{i}`` per environment (the source's: its out split)."""
    if method not in METHODS:
        raise ValueError(f"single-source selection supports {[m.key for m in METHODS]}, "
                         f"not {method.key!r}")
    grouped = group_records(records)
    runs = single_source_runs(grouped) if runs is None else runs
    reads = READS[method.key]
    in_acc, out_acc = grouped.read("env{t}_in_acc", reads), grouped.read("env{t}_out_acc", reads)
    rows, columns = runs["record"].to_numpy(), np.arange(in_acc.shape[1])[None, :]
    sources = columns == runs["source"].to_numpy()[:, None]
    targets = ~sources & (columns < runs["n_envs"].to_numpy()[:, None])
    runs = runs.assign(target=masked_mean(in_acc[rows], targets),
                       job=grouped.records["job"].to_numpy()[rows])
    return select_by_masks(runs, RUN, method, out_acc, sources, targets,
                           np.where(sources, out_acc[rows], in_acc[rows]), ~sources)


def select_single_source(records: pd.DataFrame | GroupedRecords,
                         method: SelectionMethod) -> pd.DataFrame:
    """The chosen run per (trial_seed, dataset, algorithm, source), ``acc{i}`` per env."""
    return single_source_selection(records, method).chosen


def single_source_tables(records: pd.DataFrame | GroupedRecords, method: SelectionMethod,
                         datasets: list[str] | None = None,
                         selection: Selection | None = None) -> list[Table]:
    """One table per (dataset, source environment) of the single-source runs (``selection``:
    the method's, made here if not given)."""
    grouped = group_records(records)
    chosen = (selection or single_source_selection(grouped, method)).chosen
    algorithms, tables = algorithm_order(grouped), []
    for dataset in [d for d in dataset_order(grouped) if datasets is None or d in datasets]:
        labels = environment_labels(grouped.records, dataset)
        for source, at_source in chosen[chosen["dataset"] == dataset].groupby("source"):
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
                                source=labels[source], keys=[*labels, "Avg"]))
    return tables


def single_source_sections(grouped: GroupedRecords, methods: list[SelectionMethod], mode: str,
                           runs: pd.DataFrame) -> list[Section]:
    """Per method that applies, a section of single-source tables (``mode``: auto, on, off)."""
    datasets = single_source_datasets(grouped, runs) if mode == "auto" else None
    if mode == "off" or datasets == []:
        return []
    selections = {m: single_source_selection(grouped, m, runs) for m in methods if m in METHODS}
    sections = [Section(method, SINGLE_SOURCE_KEY, SINGLE_SOURCE_DESCRIPTION,
                        single_source_tables(grouped, method, datasets, selection), selection)
                for method, selection in selections.items()]
    return [section for section in sections if section.tables]
