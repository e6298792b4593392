"""UDG tables (records with ``args.label_fraction``, :mod:`dg_plugins.train.udg`): their own
selection and one table per (dataset, test environment set) (docs/collect.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.collect.records import leading_count
from dg_plugins.collect.selection import (IID, ORACLE, SelectionMethod, group_ids, read_accs,
                                          select_by_masks)
from dg_plugins.job.selection import SELECTION_READS
from dg_plugins.collect.tables import (Cell, Section, Table, algorithm_order, dataset_order,
                                       environment_labels)

#: The methods that apply to UDG runs.
METHODS = (IID, ORACLE)
FRACTION_COLUMN = "args.label_fraction"
#: ``Section.test_key`` of UDG sections.
UDG_KEY = "udg"
UDG_DESCRIPTION = ("UDG: self-supervised pretraining on the source domains, fine-tuning on a "
                   "labelled fraction")


def is_udg(records: pd.DataFrame) -> np.ndarray:
    """Boolean mask of UDG records (``args.label_fraction`` set)."""
    if FRACTION_COLUMN not in records.columns:
        return np.zeros(len(records), dtype=bool)
    return np.array([v is not None and v == v for v in records[FRACTION_COLUMN]], dtype=bool)


def select_udg(records: pd.DataFrame, method: SelectionMethod) -> pd.DataFrame:
    """The chosen run per group, with ``acc{t}`` for every target t (UDG records only)."""
    if method not in METHODS:
        raise ValueError(f"UDG selection supports {[m.key for m in METHODS]}, not {method.key!r}")
    records = records.reset_index(drop=True)
    columns = ["trial_seed", "dataset", "algorithm", "label_fraction", "test_envs"]
    runs = pd.DataFrame({
        "record": np.arange(len(records)),
        "trial_seed": records["args.trial_seed"].to_numpy(),
        "dataset": records["args.dataset"].to_numpy(),
        "algorithm": records["args.algorithm"].to_numpy(),
        "label_fraction": records[FRACTION_COLUMN].astype(float).to_numpy(),
        "test_envs": records["args.test_envs"].to_numpy(),
        "hparams_seed": records["args.hparams_seed"].to_numpy(),
        "step": records["step"].to_numpy(),
    })
    if runs.empty:
        return runs.assign(val_acc=[], group=[])
    runs["group"] = group_ids(*(runs[c].to_numpy() for c in columns))
    reads = SELECTION_READS["udg"][method.key]
    out = read_accs(records, "env{t}_out_acc", reads)
    inn = read_accs(records, "env{t}_in_acc", reads)
    width = out.shape[1]
    targets = np.zeros((len(records), width), dtype=bool)
    for row, envs in enumerate(runs["test_envs"]):
        targets[row, [e for e in envs if e < width]] = True
    inside = np.arange(width)[None, :] < leading_count(~np.isnan(out))[:, None]
    chosen = select_by_masks(runs, out, inside & ~targets, inside & targets, method)
    rows = chosen["record"].to_numpy()
    for t in range(width):
        chosen[f"acc{t}"] = np.where(targets[rows, t], inn[rows, t], np.nan)
    return chosen


def fraction_label(fraction: float) -> str:
    """``0.01`` -> ``1%``, ``1.0`` -> ``100%``."""
    return f"{100 * float(fraction):g}%"


def udg_tables(records: pd.DataFrame, method: SelectionMethod) -> list[Table]:
    """One table per (dataset, test environment set): rows ``<algorithm> <label fraction>``,
    columns the targets and ``Avg``."""
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


def udg_sections(records: pd.DataFrame, methods: list[SelectionMethod]) -> list[Section]:
    """Per method that applies, the section of UDG tables (``records``: UDG records only)."""
    sections = []
    for method in [m for m in methods if m in METHODS]:
        tables = udg_tables(records, method)
        if tables:
            sections.append(Section(method, UDG_KEY, UDG_DESCRIPTION, tables))
    return sections
