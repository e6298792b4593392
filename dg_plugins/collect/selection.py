"""DomainBed's model selection (``domainbed/model_selection.py``, ``get_grouped_records`` of
``domainbed/lib/reporting.py``), vectorised, with its exact tie and NaN semantics; each method
reads through ``job.selection.SELECTION_READS`` (docs/collect.md). Every kind of table (standard
and IP/OOP here, single-source, UDG) selects once into a :class:`Selection` that its tables and
the figures read."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache, partial
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from dg_plugins.collect.records import ACC_KEY, acc_matrix
from dg_plugins.job.selection import ALL, SELECTION_READS, TEST, TRAIN

#: Default test key template: the in split of the test environment (``model_selection.py``).
TEST_KEY = "env{t}_in_acc"
SELECTED_COLUMNS = ["trial_seed", "dataset", "algorithm", "test_env", "hparams_seed", "step",
                    "val_acc", "test_acc", "record", "group"]


class GroupedRecords:
    """Records and their group memberships (``get_grouped_records``), computed once."""

    def __init__(self, records: pd.DataFrame) -> None:
        self.records = records.reset_index(drop=True)
        # per record: the index of its test_envs in distinct_test_envs
        self.test_envs_code, self.distinct_test_envs = pd.factorize(
            self.records["args.test_envs"].to_numpy(), use_na_sentinel=False)
        record, test_env, self.n_test_envs = _expand_test_envs(self.test_envs_code,
                                                               self.distinct_test_envs)
        key_values = {name: self.records[f"args.{name}"].to_numpy()
                      for name in ("trial_seed", "dataset", "algorithm")}
        self.algorithms, self.datasets = (  # by first appearance
            list(pd.factorize(key_values[name], use_na_sentinel=False)[1])
            for name in ("algorithm", "dataset"))
        group = group_ids(*(values[record] for values in key_values.values()), test_env)
        firsts = np.unique(group, return_index=True)[1]
        self.groups = pd.DataFrame({  # the group keys per group id
            **{name: values[record[firsts]] for name, values in key_values.items()},
            "test_env": test_env[firsts]}).rename_axis("group")
        self.members = pd.DataFrame({  # a row per (record, test_env)
            "test_env": test_env, "record": record, "n_test_envs": self.n_test_envs[record],
            "hparams_seed": self.records["args.hparams_seed"].to_numpy()[record],
            "step": self.records["step"].to_numpy()[record], "group": group})
        #: the memberships of single-test-env records (the only ones IID and oracle look at)
        self.single = self.members[self.members["n_test_envs"] == 1]
        #: :func:`acc_matrix` of the records for a key template, computed once per template
        self.accs = cache(partial(acc_matrix, self.records))
        self._env_counts: dict = {}
        self.selections: dict = {}  # method -> its standard_selection, made once

    def read(self, key: str, reads: Mapping[str, str]) -> np.ndarray:
        """:meth:`accs` as a method declared to read ``reads`` sees it: NaN outside the
        environments its declaration names for the key's split (:func:`read_mask`)."""
        matrix = self.accs(key)
        mask = read_mask(key, reads, self.is_test(matrix.shape[1]))
        return matrix if mask is None else np.where(mask, matrix, np.nan)

    def env_counts(self, reads: Mapping[str, str]) -> np.ndarray:
        """Per record, its environment count as DomainBed probes it (``env0_out_acc``,
        ``env1_out_acc``, ... until one is missing), seen through ``reads``; computed once."""
        role = reads.get("out")  # all that reading the out split depends on
        if role not in self._env_counts:
            self._env_counts[role] = leading_count(~np.isnan(self.read("env{t}_out_acc", reads)))
        return self._env_counts[role]

    def is_test(self, width: int) -> np.ndarray:
        """(records x ``width``) booleans: environment i is among the record's test_envs."""
        table = np.zeros((len(self.distinct_test_envs), width), dtype=bool)
        for row, envs in enumerate(self.distinct_test_envs):
            table[row, [e for e in envs if 0 <= e < width]] = True
        return table[self.test_envs_code]


def leading_count(present: np.ndarray) -> np.ndarray:
    """Per row, how many consecutive True values start it (DomainBed counts environments by
    probing ``env0_..``, ``env1_..`` until a key is missing)."""
    if present.shape[1] == 0:
        return np.zeros(len(present), dtype=int)
    return np.where(present.all(axis=1), present.shape[1], (~present).argmax(axis=1))


def group_ids(*keys: np.ndarray) -> np.ndarray:
    """Per row, the id of its ``keys`` combination by first appearance (``ngroup()``)."""
    ids = np.zeros(len(keys[0]) if keys else 0, dtype=np.int64)
    for key in keys:
        code = pd.factorize(key, use_na_sentinel=False)[0]
        ids = pd.factorize(ids * (int(code.max(initial=-1)) + 1) + code)[0]
    return ids


def _expand_test_envs(codes: np.ndarray, distinct) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(record, test_env, n_test_envs)`` per entry of each record's ``test_envs``."""
    lengths = np.array([len(envs) for envs in distinct], dtype=np.int64)
    table = np.zeros((len(distinct), int(lengths.max(initial=0))), dtype=np.int64)
    for row, envs in enumerate(distinct):
        table[row, :len(envs)] = envs
    counts = lengths[codes]
    record = np.repeat(np.arange(len(codes)), counts)
    position = np.arange(len(record)) - np.repeat(np.cumsum(counts) - counts, counts)
    return record, table[codes[record], position], counts


def read_mask(key: str, reads: Mapping[str, str], is_test: np.ndarray) -> np.ndarray | None:
    """Where a method declared to read ``reads`` may read ``key`` (a template whose split is in,
    out, or both for ``pooled``): a boolean matrix like ``is_test``, or None for everywhere."""
    if (match := ACC_KEY.fullmatch(key.format(t=0))) is None:
        raise ValueError(f"{key!r} is not an accuracy key template (env{{t}}_<split>_acc)")
    split = match.group(2).split("_")[0]
    mask = None
    for split in ("in", "out") if split == "pooled" else (split,):
        role = reads.get(split)
        if role == ALL:
            continue
        part = (is_test if role == TEST else ~is_test if role == TRAIN
                else np.zeros_like(is_test))
        mask = part if mask is None else mask & part
    return mask


def group_records(records: pd.DataFrame | GroupedRecords) -> GroupedRecords:
    """Group records per (trial_seed, dataset, algorithm, test_env) (``get_grouped_records``)."""
    return records if isinstance(records, GroupedRecords) else GroupedRecords(records)


def _at(matrix: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``matrix[rows, cols]`` with NaN where ``cols`` is past the matrix width."""
    inside = (cols >= 0) & (cols < matrix.shape[1])
    out = np.full(len(rows), np.nan)
    out[inside] = matrix[rows[inside], cols[inside]]
    return out


def _reduce_rows(values: np.ndarray, widths: np.ndarray, skip: np.ndarray,
                 total: Callable) -> np.ndarray:
    """Per row the ``total`` of its values but ``skip``, on blocks of rows sharing (width, skip) so
    that numpy sums in the order of DomainBed's per-record ``np.mean`` (bit-identical)."""
    out = np.full(len(values), np.nan)
    for width, left_out in set(zip(widths.tolist(), skip.tolist())):
        rows = np.flatnonzero((widths == width) & (skip == left_out))
        cols = [i for i in range(width) if i != left_out]
        # An empty mean (one-environment dataset) is NaN, silently, as in DomainBed's Q.mean.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[rows] = total(values[np.ix_(rows, cols)])
    return out


def best_rows(frame: pd.DataFrame, by: list[str], key: np.ndarray, tiebreak: str,
              ties_to_largest: bool) -> pd.DataFrame:
    """Per ``by`` group, the row with the largest ``key``; among equal keys the row with the
    smallest (or largest) ``tiebreak``. The one place where every selection step picks a row."""
    ranked = frame.assign(_key=key).sort_values(
        [*by, "_key", tiebreak], ascending=[True] * len(by) + [False, not ties_to_largest],
        kind="stable")
    return ranked.drop_duplicates(by).drop(columns="_key")


def best_checkpoint(candidates: pd.DataFrame, order: str) -> pd.DataFrame:
    """Per run (group, hparams_seed), the first candidate with the maximal val_acc in ``order``
    (``Q.argmax``: earliest checkpoint on ties). As Python's ``max``: a NaN first candidate
    wins (nothing compares greater), a later NaN never does."""
    by = ["group", "hparams_seed"]
    key = candidates["val_acc"].to_numpy(dtype=float).copy()
    nan = np.isnan(key)
    if nan.any():
        first = ~candidates.sort_values(order, kind="stable").duplicated(by).reindex(
            candidates.index).to_numpy()
        key[nan & first], key[nan & ~first] = np.inf, -np.inf
    return best_rows(candidates, by, key, order, ties_to_largest=False)


def last_checkpoint(candidates: pd.DataFrame) -> pd.DataFrame:
    """Per run (group, hparams_seed), the last record of its largest step (oracle's)."""
    return best_rows(candidates, ["group", "hparams_seed"],
                     candidates["step"].to_numpy(dtype=float), "record", ties_to_largest=True)


def best_run(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group, the run with the best ``val_acc`` (NaN ranks lowest; ties go to the largest
    hparams_seed, as DomainBed's ``hparams_accs`` sorts), in group order."""
    val = runs["val_acc"].to_numpy(dtype=float)
    chosen = best_rows(runs, ["group"], np.where(np.isnan(val), -np.inf, val), "hparams_seed",
                       ties_to_largest=True)
    return chosen.sort_values("group").reset_index(drop=True)


def masked_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row means of ``values`` over ``mask``, skipping NaN (NaN where nothing is left)."""
    valid = mask & ~np.isnan(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(valid, values, 0.0).sum(axis=1) / valid.sum(axis=1)


# The three methods: each scores every record it can, then keeps a checkpoint per run
def _iid_scores(grouped: GroupedRecords, reads: Mapping[str, str]) -> pd.DataFrame:
    """Training-domain validation (``IIDAccuracySelectionMethod``; also the DMG release's
    best-epoch rule): the mean out-split accuracy of the training environments."""
    single = grouped.single
    rows = single["record"].to_numpy()
    out = grouped.read("env{t}_out_acc", reads)[rows]
    return single.assign(val_acc=_reduce_rows(out, grouped.env_counts(reads)[rows],
                                              single["test_env"].to_numpy(),
                                              lambda block: np.mean(block, axis=1)))


def _oracle_scores(grouped: GroupedRecords, reads: Mapping[str, str]) -> pd.DataFrame:
    """Test-domain validation (oracle): the test environment's ``env{t}_out_acc``."""
    single = grouped.single
    return single.assign(val_acc=_at(grouped.read("env{t}_out_acc", reads),
                                     single["record"].to_numpy(), single["test_env"].to_numpy()))


def loo_scores(grouped: GroupedRecords, reads: Mapping[str, str]) -> pd.DataFrame:
    """Leave-one-domain-out's score of every step it can score (single and pair runs)."""
    members = grouped.members
    step_id = group_ids(*(members[key].to_numpy() for key in ("group", "hparams_seed", "step")))
    # DomainBed reads the environment count from the first record of the step (members are in
    # record order, so a step's first member has its smallest record) ...
    first = members["record"].to_numpy()[np.unique(step_id, return_index=True)[1]][step_id]
    # ... and needs exactly one single-test-env record at the step.
    singles = np.bincount(step_id, weights=members["n_test_envs"].to_numpy() == 1,
                          minlength=1)[step_id]
    members = members.assign(_step=step_id, _n_envs=grouped.env_counts(reads)[first],
                             _singles=singles)
    single = members[(members["n_test_envs"] == 1) & (members["_singles"] == 1)]

    # Validation accuracies: the pair run [t, j] gives env{j}_in_acc (the last such record wins);
    # -1 marks a missing environment, as in DomainBed.
    pairs = members[members["n_test_envs"] == 2]
    t = pairs["test_env"].to_numpy()
    # The pair's other environment: [a, b] with a == t gives b, else a; i.e. a + b - t.
    pair_sums = np.array([sum(envs) if len(envs) == 2 else 0
                          for envs in grouped.distinct_test_envs], dtype=np.int64)
    other = pair_sums[grouped.test_envs_code[pairs["record"].to_numpy()]] - t
    keep = other != t
    pairs, other = pairs[keep], other[keep]
    value = _at(grouped.read("env{t}_in_acc", reads), pairs["record"].to_numpy(), other)
    value[np.isnan(value)] = -1.0
    width = max(int(members["_n_envs"].to_numpy().max(initial=0)), int(other.max(initial=-1)) + 1)
    val_accs = np.full((int(members["_step"].to_numpy().max(initial=-1)) + 1, width), -1.0)
    pair_order = np.argsort(pairs["record"].to_numpy(), kind="stable")  # later records overwrite
    val_accs[pairs["_step"].to_numpy()[pair_order], other[pair_order]] = value[pair_order]

    n_envs, test_env = single["_n_envs"].to_numpy(), single["test_env"].to_numpy()
    per_step = val_accs[single["_step"].to_numpy()]
    missing = _reduce_rows(per_step == -1.0, n_envs, test_env, lambda block: block.any(axis=1))
    sums = _reduce_rows(per_step, n_envs, test_env, lambda block: np.sum(block, axis=1))
    with np.errstate(all="ignore"):
        val = sums / (n_envs - 1)
    ok = missing == 0
    return single[ok].assign(val_acc=val[ok])


@dataclass(frozen=True, eq=False)
class SelectionMethod:
    """A model-selection method: ``key`` (``--selection``), ``name`` (DomainBed's), ``scores``
    of the standard runs' records read through ``reads``, ``checkpoint`` kept per run."""

    key: str
    name: str
    scores: Callable[[GroupedRecords, Mapping[str, str]], pd.DataFrame]
    checkpoint: Callable[[pd.DataFrame], pd.DataFrame]

    @property
    def reads(self) -> Mapping[str, str]:
        """What this method reads from DomainBed's records (:data:`SELECTION_READS`)."""
        return SELECTION_READS["domainbed"][self.key]


IID = SelectionMethod("iid", "training-domain validation set", _iid_scores,
                      partial(best_checkpoint, order="record"))
# leave-one-domain-out: each run keeps its best step, the smallest on ties
LOO = SelectionMethod("loo", "leave-one-domain-out cross-validation", loo_scores,
                      partial(best_checkpoint, order="step"))
ORACLE = SelectionMethod("oracle", "test-domain validation set (oracle)", _oracle_scores,
                         last_checkpoint)
#: The methods by ``--selection`` key, in DomainBed's output order (collect_results' default).
METHODS: dict[str, SelectionMethod] = {m.key: m for m in (IID, LOO, ORACLE)}


def get_method(key: str) -> SelectionMethod:
    """The method for a ``--selection`` key (or its printed name)."""
    for method in METHODS.values():
        if key in (method.key, method.name):
            return method
    raise ValueError(f"unknown selection method {key!r}; choose from {', '.join(METHODS)}")


@dataclass
class Selection:
    """One method's selection on one kind of runs: ``scored``, every record of those runs with
    ``val_acc`` (the signal the method selects by, NaN where it scores none), ``target`` (the
    accuracy the tables report) and ``job``; ``chosen``, the chosen checkpoint per group (with
    ``val_acc`` and ``target``); ``run``, the columns that name a run."""

    scored: pd.DataFrame
    chosen: pd.DataFrame
    run: list[str]


def select_by_masks(runs: pd.DataFrame, run: list[str], method: SelectionMethod,
                    out_acc: np.ndarray, sources: np.ndarray, targets: np.ndarray,
                    accs: np.ndarray, averaged: np.ndarray) -> Selection:
    """DomainBed's iid and oracle for runs with several sources or targets (single-source, UDG):
    ``runs`` (a row per record) grouped by their ``run`` columns but hparams_seed, scored by the
    mean ``out_acc`` of ``sources`` (iid) or ``targets`` (oracle); the best run per group, with
    ``acc{i}`` from ``accs`` and ``target``, their mean over ``averaged``. Masks and ``accs`` have
    a row per run, ``out_acc`` per record."""
    if runs.empty:
        return Selection(runs, runs.assign(val_acc=[], group=[]), run)
    rows = runs["record"].to_numpy()
    scored = runs.assign(group=group_ids(*(runs[key].to_numpy() for key in run[:-1])),
                         val_acc=masked_mean(out_acc[rows], sources if method is IID else targets))
    chosen = best_run(method.checkpoint(scored))
    at = pd.Index(rows).get_indexer(chosen["record"].to_numpy())  # each chosen run's row
    return Selection(scored, chosen.assign(**{f"acc{i}": accs[at, i] for i in range(accs.shape[1])},
                                           target=masked_mean(accs[at], averaged[at])), run)


def standard_selection(records: pd.DataFrame | GroupedRecords,
                       method: SelectionMethod) -> Selection:
    """The standard tables' Selection, once per method: ``scored``, the single-test-env records;
    ``chosen``, the chosen run of every group (:data:`SELECTED_COLUMNS`, ``target``)."""
    grouped = group_records(records)
    if method not in grouped.selections:
        scores = method.scores(grouped, method.reads)
        chosen = best_run(method.checkpoint(scores)[
            ["group", "hparams_seed", "record", "step", "val_acc"]])
        groups = chosen["group"].to_numpy()
        test = _at(grouped.read(TEST_KEY, method.reads), chosen["record"].to_numpy(),
                   grouped.groups["test_env"].to_numpy()[groups])
        info = grouped.groups.iloc[groups].reset_index(drop=True)
        chosen = pd.concat([info, chosen.assign(test_acc=test)], axis=1)[SELECTED_COLUMNS]
        single = grouped.single
        rows, env = single["record"].to_numpy(), single["test_env"].to_numpy()
        info = grouped.groups.iloc[single["group"].to_numpy()]
        scored = single.assign(
            **{key: info[key].to_numpy() for key in ("trial_seed", "dataset", "algorithm")},
            target=_at(grouped.accs(TEST_KEY), rows, env),
            job=grouped.records["job"].to_numpy()[rows]).merge(
            scores[["record", "val_acc"]], on="record", how="left")
        grouped.selections[method] = Selection(scored, chosen.assign(target=test),
                                               ["group", "hparams_seed"])
    return grouped.selections[method]


def select(records: pd.DataFrame | GroupedRecords, method: SelectionMethod | str,
           test_key: str = TEST_KEY) -> pd.DataFrame:
    """The chosen run of every group (``sweep_acc``), in group order: :data:`SELECTED_COLUMNS`."""
    grouped = group_records(records)
    method = get_method(method) if isinstance(method, str) else method
    chosen = standard_selection(grouped, method).chosen[SELECTED_COLUMNS]
    if test_key == TEST_KEY:
        return chosen
    return chosen.assign(test_acc=_at(grouped.read(test_key, method.reads),
                                      chosen["record"].to_numpy(), chosen["test_env"].to_numpy()))
