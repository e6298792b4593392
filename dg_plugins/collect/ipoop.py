"""IP/OOP keys: records with ``env{i}_in_ip_acc`` / ``env{i}_in_oop_acc`` keys get tables of the
standard selection reporting those keys (:func:`tables.standard_sections`), on the in split or
pooled over the whole test environment (docs/collect.md)."""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from dg_plugins.collect.records import acc_width
from dg_plugins.job.selection import OUTSIDE_IN_SUBSET


class SubsetKey(NamedTuple):
    """An extra test key: its template (in ``t``), its sections' subtitle (``<short label>:
    <description>``), and what its tables' headers say after it."""

    template: str
    subtitle: str
    note: str


_SUBSETS = (("ip", "in-pretraining"), ("oop", "out-of-pretraining"))
#: Extra test keys reported when present: each subset on the test environment's in split, then
#: over the whole test environment, its in and out splits pooled, each split's subset accuracy
#: weighted by the subset's size there (``env{i}_{in,out}_{ip,oop}_count``), as the IP/OOP
#: authors report each subset over the whole target domain.
SUBSET_KEYS = tuple(SubsetKey(
    f"env{{t}}_in_{key}_acc", f"{key.upper()}: {what} subset of the test environment",
    f"{key.upper()} subset of the test environment's in split") for key, what in _SUBSETS)
POOLED_SUBSET_KEYS = tuple(SubsetKey(
    f"env{{t}}_pooled_{key}_acc", f"{key.upper()}, whole domain: {what} subset of the whole test "
    "environment (in and out splits pooled, weighted by their subset sizes)",
    f"{key.upper()} subset of the whole test environment, in and out splits pooled")
    for key, what in _SUBSETS)
#: Which IP/OOP figures collect_results shows (``--ipoop``): the in split's, the pooled, or both.
IPOOP_CHOICES = ("in", "pooled", "both")


def add_pooled_subsets(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` with ``env{i}_pooled_{ip,oop}_acc`` columns: the in and out splits' subset
    accuracies weighted by count, each image once (docs/collect.md). Not modified in place."""
    added = {}
    for i in range(acc_width(records)):
        for subset in ("ip", "oop"):
            names = [f"env{i}_{split}_{subset}_{kind}" for kind in ("acc", "count")
                     for split in ("in", "out")]
            if not all(name in records.columns for name in names):
                continue
            acc_in, acc_out, n_in, n_out = (records[name].to_numpy(dtype=float) for name in names)
            outside = [f"env{i}_out_{OUTSIDE_IN_SUBSET.format(subset=subset)}_{kind}"
                       for kind in ("acc", "count")]
            if all(name in records.columns for name in outside):
                acc_x, n_x = (records[name].to_numpy(dtype=float) for name in outside)
                shared = ~np.isnan(n_x)  # the records whose out split overlaps their in split
                acc_out, n_out = np.where(shared, acc_x, acc_out), np.where(shared, n_x, n_out)
            total = n_in + n_out
            weighted = (np.where(n_in > 0, acc_in, 0.0) * n_in
                        + np.where(n_out > 0, acc_out, 0.0) * n_out)
            with np.errstate(invalid="ignore", divide="ignore"):
                added[f"env{i}_pooled_{subset}_acc"] = np.where(total > 0, weighted / total,
                                                                np.nan)
    return records.assign(**added) if added else records


def subset_keys(records: pd.DataFrame, ipoop: str = "both") -> list[SubsetKey]:
    """The IP/OOP keys (in split, pooled, or both, by ``ipoop``) some environment has."""
    keys = SUBSET_KEYS * (ipoop != "pooled") + POOLED_SUBSET_KEYS * (ipoop != "in")
    patterns = [re.compile(re.escape(k.template).replace(re.escape("{t}"), r"\d+")) for k in keys]
    return [key for key, pattern in zip(keys, patterns)
            if any(pattern.fullmatch(str(column)) for column in records.columns)]
