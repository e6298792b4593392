"""UDG tables (records with ``args.label_fraction``, :mod:`dg_plugins.train.udg`): their own
selection and one table per (dataset, test environment set) (docs/collect.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.collect.selection import (IID, ORACLE, GroupedRecords, Selection,
                                          SelectionMethod, group_records, masked_mean,
                                          select_by_masks)
from dg_plugins.job.selection import SELECTION_READS
from dg_plugins.collect.tables import (Cell, Section, Table, algorithm_order, dataset_order,
                                       environment_labels)

METHODS = (IID, ORACLE)
UDG_KEY = "udg"
UDG_DESCRIPTION = ("UDG: self-supervised pretraining on the source domains, fine-tuning on a "
                   "labelled fraction")


def is_udg(records: pd.DataFrame) -> np.ndarray:
    """Boolean mask of UDG records (``args.label_fraction`` set)."""
    return records.get("args.label_fraction", pd.Series(np.nan, records.index)).notna().to_numpy()


def udg_selection(records: pd.DataFrame | GroupedRecords, method: SelectionMethod) -> Selection:
    """The UDG :class:`Selection` (UDG records only): a group per (trial_seed, dataset,
    algorithm, label fraction, test environments); ``chosen`` has ``acc{t}`` per target t."""
    if method not in METHODS:
        raise ValueError(f"UDG selection supports {[m.key for m in METHODS]}, not {method.key!r}")
    grouped = group_records(records)
    records, run = grouped.records, ["trial_seed", "dataset", "algorithm", "label_fraction",
                                     "test_envs", "hparams_seed"]
    runs = pd.DataFrame({"record": np.arange(len(records)), **{
        name: records[f"args.{name}"].to_numpy() for name in run},
        "step": records["step"].to_numpy(), "job": records["job"].to_numpy()})
    runs["label_fraction"] = runs["label_fraction"].astype(float)
    reads = SELECTION_READS["udg"][method.key]
    out, inn = grouped.read("env{t}_out_acc", reads), grouped.read("env{t}_in_acc", reads)
    targets = grouped.is_test(out.shape[1])
    inside = np.arange(out.shape[1])[None, :] < grouped.env_counts(reads)[:, None]
    return select_by_masks(runs.assign(target=masked_mean(inn, targets)), run, method, out,
                           inside & ~targets, inside & targets, np.where(targets, inn, np.nan),
                           targets)


def select_udg(records: pd.DataFrame, method: SelectionMethod) -> pd.DataFrame:
    """The chosen run per group, with ``acc{t}`` for every target t (UDG records only)."""
    return udg_selection(records, method).chosen


def fraction_label(fraction: float) -> str:
    """``0.01`` -> ``1%``, ``1.0`` -> ``100%``."""
    return f"{100 * float(fraction):g}%"


def _udg_tables(grouped: GroupedRecords, method: SelectionMethod, chosen: pd.DataFrame
                ) -> list[Table]:
    """A table per (dataset, test environments): rows ``<algorithm> <fraction>``, targets, Avg."""
    algorithms, tables = algorithm_order(grouped), []
    for dataset in dataset_order(grouped):
        labels = environment_labels(grouped.records, dataset)
        for envs, mine in chosen[chosen["dataset"] == dataset].groupby("test_envs"):
            names = [labels[t] if t < len(labels) else str(t) for t in envs]
            rows = {}
            for algorithm in algorithms:
                of_algorithm = mine[mine["algorithm"] == algorithm]
                for fraction, runs in of_algorithm.groupby("label_fraction"):
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


def udg_sections(records: pd.DataFrame, methods: list[SelectionMethod]) -> list[Section]:
    """Per method that applies, the section of UDG tables (``records``: UDG records only)."""
    grouped = group_records(records)
    selections = {m: udg_selection(grouped, m) for m in methods if m in METHODS}
    sections = [Section(method, UDG_KEY, UDG_DESCRIPTION,
                        _udg_tables(grouped, method, selection.chosen), selection)
                for method, selection in selections.items()]
    return [section for section in sections if section.tables]
