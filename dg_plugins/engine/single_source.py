"""Model selection for single-source DG runs: jobs trained on one environment and tested on all
the others.

``sweep --single_source`` runs one job per source environment s with ``test_envs`` = every
environment but s. DomainBed's selection methods only score single-test-environment runs, so these
jobs get their own selection here (and their own tables,
:func:`dg_plugins.engine.tables.single_source_tables`). Per (trial_seed, dataset, algorithm,
source), each hparams seed is a run:

* ``iid`` (training-domain validation set): a checkpoint's val_acc is ``env{s}_out_acc``; a run
  keeps its earliest best checkpoint (early stopping, as DomainBed's IID method);
* ``oracle`` (test-domain validation set): the run's last checkpoint; val_acc is the mean of the
  targets' ``env{t}_out_acc``.

Across runs the best val_acc wins, ties to the largest hparams_seed (DomainBed's rule,
:func:`dg_plugins.engine.selection.best_run`). The chosen run reports the source's in-domain
validation accuracy (``env{s}_out_acc``) and every target's ``env{t}_in_acc``.

Which records count: those whose ``test_envs`` leave exactly one environment. On a 3-environment
dataset that is also what DomainBed's leave-one-domain-out pair runs look like, so by default
(:func:`single_source_datasets`) such a dataset only gets these tables when it has no
single-test-environment record (a pure single-source sweep); datasets with 4 or more environments
get them whenever such records exist. ``collect_results --single_source`` forces them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.engine.records import leading_count
from dg_plugins.engine.selection import (IID, ORACLE, GroupedRecords, SelectionMethod, group_ids,
                                         group_records, select_by_masks)

#: The selection methods that apply to single-source runs (LOO needs several sources).
METHODS = (IID, ORACLE)


def single_source_runs(records: pd.DataFrame | GroupedRecords) -> pd.DataFrame:
    """The single-source records, with columns ``record`` (row position), ``trial_seed``,
    ``dataset``, ``algorithm``, ``source``, ``hparams_seed``, ``step``, ``n_envs``. Computed once
    per :class:`GroupedRecords` (treat the result as read-only)."""
    grouped = group_records(records)
    if "single_source_runs" not in grouped.memo:
        grouped.memo["single_source_runs"] = _single_source_runs(grouped)
    return grouped.memo["single_source_runs"]


def _single_source_runs(grouped: GroupedRecords) -> pd.DataFrame:
    records = grouped.records
    n_envs = leading_count(~np.isnan(grouped.accs("env{t}_in_acc")))
    # The source of each distinct (test_envs, environment count) pair, spread to the records.
    width = int(n_envs.max(initial=0)) + 1
    pairs, pair_of_record = np.unique(grouped.test_envs_code * width + n_envs, return_inverse=True)
    sources = np.array([_source(grouped.distinct_test_envs[pair // width], pair % width)
                        for pair in pairs.tolist()], dtype=np.int64)[pair_of_record.ravel()]
    keep = np.flatnonzero(sources >= 0)
    return pd.DataFrame({
        "record": keep,
        "trial_seed": records["args.trial_seed"].to_numpy()[keep],
        "dataset": records["args.dataset"].to_numpy()[keep],
        "algorithm": records["args.algorithm"].to_numpy()[keep],
        "source": sources[keep],
        "hparams_seed": records["args.hparams_seed"].to_numpy()[keep],
        "step": records["step"].to_numpy()[keep],
        "n_envs": n_envs[keep],
    })


def _source(test_envs: tuple, n_envs: int) -> int:
    """The one training environment of a single-source run, or -1 for another kind of run."""
    left = set(range(n_envs)) - set(test_envs)
    return left.pop() if n_envs >= 3 and len(test_envs) == n_envs - 1 and len(left) == 1 else -1


def single_source_datasets(records: pd.DataFrame | GroupedRecords) -> list[str]:
    """Datasets whose single-source records are reported by default (see the module docstring)."""
    grouped = group_records(records)
    runs = single_source_runs(grouped)
    if runs.empty:
        return []
    singles = set(grouped.records["args.dataset"].to_numpy()[grouped.n_test_envs == 1])
    out = []
    for dataset, rows in runs.groupby("dataset", sort=False):
        if rows["n_envs"].max() >= 4 or dataset not in singles:
            out.append(dataset)
    return out


def select_single_source(records: pd.DataFrame | GroupedRecords,
                         method: SelectionMethod) -> pd.DataFrame:
    """The chosen run per (trial_seed, dataset, algorithm, source): one row with ``hparams_seed``,
    ``step``, ``val_acc``, ``record`` and ``acc{i}`` per environment (the source's out-split
    accuracy, the targets' in-split accuracies)."""
    if method not in METHODS:
        raise ValueError(f"single-source selection supports {[m.key for m in METHODS]}, "
                         f"not {method.key!r}")
    grouped = group_records(records)
    runs = single_source_runs(grouped)
    if runs.empty:
        return runs.assign(val_acc=[], group=[])
    keys = ["trial_seed", "dataset", "algorithm", "source"]
    runs = runs.assign(group=group_ids(*(runs[key].to_numpy() for key in keys)))
    in_acc, out_acc = grouped.accs("env{t}_in_acc"), grouped.accs("env{t}_out_acc")
    source, width = runs["source"].to_numpy(), in_acc.shape[1]
    columns = np.arange(width)[None, :]
    sources = columns == source[:, None]
    targets = ~sources & (columns < runs["n_envs"].to_numpy()[:, None])
    chosen = select_by_masks(runs, out_acc, sources, targets, method)
    chosen_rows, chosen_source = chosen["record"].to_numpy(), chosen["source"].to_numpy()
    accs = in_acc[chosen_rows].copy()
    accs[np.arange(len(chosen)), chosen_source] = out_acc[chosen_rows, chosen_source]
    for i in range(width):
        chosen[f"acc{i}"] = accs[:, i]
    return chosen
