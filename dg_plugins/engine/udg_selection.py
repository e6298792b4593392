"""Model selection for UDG runs (records with ``args.label_fraction``; see
:mod:`dg_plugins.engine.udg_jobs`). Torch-free, like the rest of collect_results.

A UDG run is trained on the source environments (every environment not in ``test_envs``, which
may hold several targets, e.g. DomainNet's 3+3 split) and evaluated on the targets. Groups are
``(trial_seed, dataset, algorithm, label_fraction, test_envs)``; every hparams_seed is a run.
DomainBed's methods, adapted to several targets:

* ``iid`` (training-domain validation set): a checkpoint's val_acc is the mean ``env{i}_out_acc``
  over the source environments (their held-out labelled data: the release's "source held-out"
  selection); a run keeps its earliest best checkpoint;
* ``oracle`` (test-domain validation set): the run's last checkpoint, val_acc the mean of the
  targets' ``env{t}_out_acc``.

Leave-one-domain-out needs runs with other test sets and does not apply. Across runs the best
val_acc wins, ties to the largest hparams_seed (DomainBed's rule). The chosen record reports each
target's ``env{t}_in_acc``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.engine.records import acc_matrix, leading_count
from dg_plugins.engine.selection import IID, ORACLE, SelectionMethod, group_ids, select_by_masks

#: The methods that apply to UDG runs.
METHODS = (IID, ORACLE)
FRACTION_COLUMN = "args.label_fraction"


def is_udg(records: pd.DataFrame) -> np.ndarray:
    """Boolean mask of UDG records (``args.label_fraction`` set)."""
    if FRACTION_COLUMN not in records.columns:
        return np.zeros(len(records), dtype=bool)
    return np.array([v is not None and v == v for v in records[FRACTION_COLUMN]], dtype=bool)


def select_udg(records: pd.DataFrame, method: SelectionMethod) -> pd.DataFrame:
    """The chosen run per group: columns ``trial_seed, dataset, algorithm, label_fraction,
    test_envs, hparams_seed, step, val_acc, record`` and ``acc{t}`` (the target's
    ``env{t}_in_acc``) for every target t. ``records``: UDG records only (row positions are
    ``record``)."""
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
    out = acc_matrix(records, "env{t}_out_acc")
    inn = acc_matrix(records, "env{t}_in_acc")
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
