"""DomainBed's model-selection methods (dg_plugins.collect.selection; ``domainbed/model_selection.py``)."""

import os
import random
import sys

import numpy as np
import pandas as pd
import pytest

from dg_plugins.collect.selection import (IID, LOO, METHODS, ORACLE, get_method,
                                          group_records, select)
from dg_plugins.collect.udg import select_udg

from support.helpers import frame_of

N_ENVS = 3


def record(test_envs, step, hparams_seed=0, trial=0, dataset="D", algorithm="A", accs=None,
           default=0.5):
    """A record of a 3-environment dataset; every accuracy is ``default`` unless in ``accs``
    (e.g. {"env1_out_acc": 0.9})."""
    rec = {"args": {"trial_seed": trial, "dataset": dataset, "algorithm": algorithm,
                    "test_envs": list(test_envs), "hparams_seed": hparams_seed,
                    "output_dir": f"out/{hparams_seed}/{test_envs}"},
           "step": step, "hparams": {"lr": hparams_seed}}
    for i in range(N_ENVS):
        rec[f"env{i}_in_acc"] = rec[f"env{i}_out_acc"] = default
    rec.update(accs or {})
    return rec


def chosen(records, method, **where):
    """The selection row of the group matching ``where`` (None if that group has none)."""
    table = select(frame_of(records), method)
    for key, value in where.items():
        table = table[table[key] == value]
    assert len(table) <= 1
    return None if table.empty else table.iloc[0]


def test_methods_and_names():
    assert list(METHODS) == ["iid", "loo", "oracle"]
    assert [m.name for m in METHODS.values()] == [
        "training-domain validation set", "leave-one-domain-out cross-validation",
        "test-domain validation set (oracle)"]
    assert get_method("loo") is LOO and get_method("training-domain validation set") is IID
    # one rule per name: the DMG release's best-epoch rule is iid (no second name for it)
    for key in ("best", "iid_best"):
        with pytest.raises(ValueError, match=f"unknown selection method '{key}'; choose from "
                                             "iid, loo, oracle$"):
            get_method(key)


def test_oracle_takes_the_last_step():
    records = [record([0], 0, accs={"env0_out_acc": 0.99, "env0_in_acc": 0.9}),
               record([0], 100, accs={"env0_out_acc": 0.1, "env0_in_acc": 0.2})]
    row = chosen(records, ORACLE, test_env=0)
    assert (row["step"], row["val_acc"], row["test_acc"]) == (100, 0.1, 0.2)


def test_iid_early_stops_at_the_best_training_domain_validation():
    records = [record([0], 0, accs={"env1_out_acc": 0.2, "env2_out_acc": 0.4}),
               record([0], 100, accs={"env1_out_acc": 0.8, "env2_out_acc": 0.6,
                                      "env0_in_acc": 0.7, "env0_out_acc": 0.0}),
               record([0], 200, accs={"env1_out_acc": 0.6, "env2_out_acc": 0.8}),  # a tie
               record([0], 300, accs={"env1_out_acc": 0.5, "env2_out_acc": 0.5})]
    row = chosen(records, IID, test_env=0)
    assert row["step"] == 100  # the earliest of the tied best checkpoints
    assert row["val_acc"] == np.mean([0.8, 0.6]) and row["test_acc"] == 0.7


def best_not_last(hparams_seed=0, shift=0.0):
    """One run with test env 0 whose best source-validation checkpoint (step 100) is neither the
    first nor the last, each checkpoint with its own target accuracy."""
    vals = {0: (0.3, 0.4), 100: (0.9, 0.7), 200: (0.5, 0.6), 300: (0.6, 0.6)}
    targets = {0: 0.11, 100: 0.22, 200: 0.33, 300: 0.44}
    return [record([0], step, hparams_seed=hparams_seed, accs={
        "env1_out_acc": vals[step][0] + shift, "env2_out_acc": vals[step][1] + shift,
        "env0_in_acc": targets[step] + shift, "env0_out_acc": 0.99})
        for step in (200, 0, 300, 100)]  # not in step order: the records' order is not the rule


def test_iid_reports_the_best_checkpoint_not_the_last():
    """DomainBed's IID keeps each run's best source-validation checkpoint: the DMG release's
    best-epoch rule (best_so_far.pth)."""
    records = best_not_last()
    row = chosen(records, IID, test_env=0)
    assert (row["step"], row["test_acc"]) == (100, 0.22)
    assert row["val_acc"] == np.mean([0.9, 0.7])
    # across hparams: the run whose best checkpoint validates best, ties to the largest seed
    records = best_not_last(0) + best_not_last(1, shift=0.05) + best_not_last(2, shift=-0.05)
    row = chosen(records, IID, test_env=0)
    assert (row["hparams_seed"], row["step"]) == (1, 100)
    assert row["test_acc"] == pytest.approx(0.27)
    # the oracle reports the last checkpoint of the run its target validation picks instead
    row = chosen(records, ORACLE, test_env=0)
    assert row["step"] == 300


def test_iid_on_udg_runs_keeps_the_best_checkpoint():
    """UDG runs (two targets) select through select_by_masks: mean source validation (env 1),
    each run's best checkpoint, its targets' in-split accuracies."""
    records = []
    for step, val, t0, t2 in ((0, 0.3, 0.1, 0.2), (100, 0.8, 0.5, 0.6), (200, 0.4, 0.9, 0.9)):
        rec = record([0, 2], step, accs={"env1_out_acc": val, "env0_in_acc": t0,
                                         "env2_in_acc": t2})
        rec["args"]["label_fraction"] = 0.1
        records.append(rec)
    frame = frame_of(records)
    row = select_udg(frame, IID).iloc[0]
    assert (row["step"], row["acc0"], row["acc2"]) == (100, 0.5, 0.6)
    assert select_udg(frame, ORACLE).iloc[0]["step"] == 200


def test_hparams_ties_go_to_the_largest_seed():
    records = []
    for seed in (2, 0, 1):  # equal validation accuracies, different test accuracies
        records += [dict(r, args=dict(r["args"], hparams_seed=seed)) for r in loo_sweep()]
        records.append(record([0], 500, hparams_seed=seed, accs={
            "env0_in_acc": seed / 10, "env1_out_acc": 0.9, "env2_out_acc": 0.9}))
    for method in (IID, ORACLE):
        row = chosen(records, method, test_env=0)
        assert row["hparams_seed"] == 2 and row["test_acc"] == 0.2, method.key
    assert chosen(records, LOO, test_env=0)["hparams_seed"] == 2


def test_best_validation_wins_across_hparams():
    records = [record([0], 0, hparams_seed=0, accs={"env1_out_acc": 0.9, "env0_in_acc": 0.3}),
               record([0], 0, hparams_seed=1, accs={"env1_out_acc": 0.1, "env0_in_acc": 0.8})]
    assert chosen(records, IID, test_env=0)["hparams_seed"] == 0


def loo_sweep(pairs=((0, 1), (0, 2), (1, 2)), steps=(0, 100)):
    """Single runs [t] and pair runs: the pair [t, j] has env{j}_in_acc = 0.1 * (j + 1) + step
    / 1000 and a misleading env{j}_out_acc."""
    records = []
    for step in steps:
        records += [record([t], step, accs={f"env{t}_in_acc": 0.5 + t / 10}) for t in range(3)]
        for a, b in pairs:
            records.append(record([a, b], step, accs={
                f"env{a}_in_acc": 0.1 * (a + 1) + step / 1000,
                f"env{b}_in_acc": 0.1 * (b + 1) + step / 1000,
                f"env{a}_out_acc": 0.0, f"env{b}_out_acc": 0.0}))
    return records


def test_leave_one_out_uses_the_pair_runs_in_split():
    row = chosen(loo_sweep(), LOO, test_env=0)
    # validation on env1 and env2 from the pairs [0, 1] and [0, 2] at the best step (100)
    assert row["step"] == 100
    assert row["val_acc"] == pytest.approx(((0.2 + 0.1) + (0.3 + 0.1)) / 2)
    assert row["test_acc"] == 0.5
    # a pair run lands in both of its groups
    grouped = group_records(frame_of(loo_sweep()))
    assert len(grouped.groups) == 3
    assert (grouped.members.groupby("record").size() == 2).sum() == 6  # the pair records


def test_leave_one_out_is_none_without_every_pair():
    records = loo_sweep(pairs=((0, 1), (1, 2)))  # [0, 2] missing
    assert chosen(records, LOO, test_env=0) is None
    assert chosen(records, LOO, test_env=2) is None
    assert chosen(records, LOO, test_env=1) is not None  # has [0, 1] and [1, 2]


def test_leave_one_out_skips_steps_with_duplicated_single_records():
    records = loo_sweep()
    records.append(record([0], 100))  # an appended re-run duplicates step 100
    row = chosen(records, LOO, test_env=0)
    assert row["step"] == 0


def test_no_result_leaves_the_group_out():
    records = [record([0, 1], 0)]  # only a pair run: no single-test-env record anywhere
    for method in METHODS.values():
        assert select(frame_of(records), method).empty


def test_test_key_template_reports_another_accuracy_with_the_same_choice():
    records = [record([1], 0, accs={"env1_in_ip_acc": 0.11, "env0_out_acc": 0.9}),
               record([1], 100, accs={"env1_in_ip_acc": 0.22})]
    frame = frame_of(records)
    standard = select(frame, IID)
    ip = select(frame, IID, test_key="env{t}_in_ip_acc")
    assert standard["step"].tolist() == ip["step"].tolist() == [0]
    assert ip["test_acc"].tolist() == [0.11]
    assert np.isnan(select(frame, IID, test_key="env{t}_in_oop_acc")["test_acc"][0])


def test_selected_run_is_identified():
    records = [record([0], 0, hparams_seed=3, accs={"env1_out_acc": 0.9})]
    frame = frame_of(records)
    row = select(frame, IID).iloc[0]
    picked = frame.iloc[row["record"]]
    assert picked["hparams"] == {"lr": 3} and picked["args.output_dir"] == "out/3/[0]"
    assert list(select(frame, IID).columns[:5]) == ["trial_seed", "dataset", "algorithm",
                                                    "test_env", "hparams_seed"]


# --------------------------------------------------------------------------------------------------
# Parity with DomainBed's own model_selection on random sweeps (ties, duplicates, missing runs,
# one-environment datasets), when a checkout is available.


def random_sweep(rng):
    records = []
    for dataset, n_envs in [("A", rng.choice([1, 2, 3, 4])), ("B", rng.choice([2, 3]))]:
        sets = [[e] for e in range(n_envs)] + [
            [a, b] for a in range(n_envs) for b in range(a + 1, n_envs)]
        if n_envs >= 3 and rng.random() < 0.3:
            sets.append([0, 1, 2])
        for algorithm in ["E", "F"][:rng.choice([1, 2])]:
            for trial in range(rng.choice([1, 2])):
                for hparams_seed in range(rng.choice([1, 2, 3])):
                    for test_envs in sets:
                        if rng.random() < 0.15:
                            continue
                        if len(test_envs) == 2 and rng.random() < 0.3:
                            test_envs = test_envs[::-1]
                        steps = sorted(rng.sample([0, 100, 200, 300], rng.choice([1, 2, 3])))
                        if rng.random() < 0.1:
                            steps += steps  # an appended re-run
                        args = {"trial_seed": trial, "dataset": dataset, "algorithm": algorithm,
                                "test_envs": test_envs, "hparams_seed": hparams_seed}
                        for step in steps:
                            rec = {"args": args, "step": step}
                            for e in range(n_envs):
                                for split in ("in", "out"):
                                    rec[f"env{e}_{split}_acc"] = rng.choice([0.25, 0.5, 0.75, 0.1])
                            records.append(rec)
    rng.shuffle(records)
    return records


@pytest.fixture
def domainbed_selection():
    root = os.environ.get("DOMAINBED_ROOT")
    if not root or not os.path.isdir(os.path.join(root, "domainbed")):
        pytest.skip("set DOMAINBED_ROOT to a DomainBed checkout to compare with its selection")
    sys.path.insert(0, root)
    try:
        from domainbed import model_selection
        from domainbed.lib import reporting
        from domainbed.lib.query import Q
    finally:
        sys.path.remove(root)
    return {"iid": model_selection.IIDAccuracySelectionMethod,
            "loo": model_selection.LeaveOneOutSelectionMethod,
            "oracle": model_selection.OracleSelectionMethod}, reporting, Q


@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # DomainBed's, on 1-env datasets
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_same_choices_as_domainbed_on_random_sweeps(domainbed_selection):
    theirs_by_key, reporting, Q = domainbed_selection
    for seed in range(40):
        records = random_sweep(random.Random(seed))
        grouped = group_records(frame_of(records))
        for key, theirs in theirs_by_key.items():
            expected = {}
            for group in reporting.get_grouped_records(Q(records)):
                accs = theirs.hparams_accs(group["records"])
                if len(accs):
                    expected[(group["trial_seed"], group["dataset"], group["algorithm"],
                              group["test_env"])] = (
                        float(accs[0][0]["val_acc"]).hex(), float(accs[0][0]["test_acc"]).hex(),
                        accs[0][1][0]["args"]["hparams_seed"])
            ours = {(r.trial_seed, r.dataset, r.algorithm, r.test_env):
                    (float(r.val_acc).hex(), float(r.test_acc).hex(), r.hparams_seed)
                    for r in select(grouped, METHODS[key]).itertuples()}
            assert ours == expected, (seed, key)


def test_group_ids_equal_pandas_ngroup_in_first_appearance_order():
    from dg_plugins.collect.selection import group_ids

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "name": rng.choice(["VLCS", "PACS", "D"], 300).astype(object),
        "seed": rng.integers(-2, 3, 300),
        "step": rng.choice([0.0, 300.0, np.nan], 300),
        "big": rng.integers(0, 2**40, 300) * rng.integers(0, 2, 300),
    })
    keys = ["name", "seed", "step", "big"]
    expected = frame.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    assert (group_ids(*(frame[k].to_numpy() for k in keys)) == expected).all()
    assert group_ids(np.array([5, 5, 2, 5, 2])).tolist() == [0, 0, 1, 0, 1]
