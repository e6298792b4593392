"""Every model-selection method reads its record keys through its declaration
(:data:`dg_plugins.job.selection.SELECTION_READS`), the one that tells train which splits
``--eval_splits selection`` evaluates. Per method: its choice is unchanged when every key outside
its declared reads is dropped from the records (what makes the declaration true), and narrowing
the declaration changes its choice (the method really reads through it)."""

import random

import pandas as pd
import pytest

from dg_plugins.collect.tables import environment_count
from dg_plugins.collect.selection import IID, LOO, ORACLE, select
from dg_plugins.collect.single_source import select_single_source
from dg_plugins.collect.udg import is_udg, select_udg
from dg_plugins.job.selection import SELECTION_READS, TEST, read_environments

from support.helpers import frame_of

N_ENVS = 4
SUBSETS = ("ip", "oop")


def records_of(test_env_sets, seed=0, fractions=(None,)):
    """Records of a 4-environment dataset: two trials, three hparams seeds, three steps, every
    ``env{i}_{in,out}_acc`` random, and IP/OOP subset keys on the test environments."""
    rng = random.Random(seed)
    records = []
    for trial in range(2):
        for envs in test_env_sets:
            for fraction in fractions:
                for hparams_seed in range(3):
                    for step in (0, 5, 10):
                        args = {"trial_seed": trial, "dataset": "D", "algorithm": "A",
                                "test_envs": list(envs), "hparams_seed": hparams_seed,
                                "output_dir": f"o/{envs}/{hparams_seed}/{fraction}"}
                        if fraction is not None:
                            args["label_fraction"] = fraction
                        rec = {"args": args, "step": step, "hparams": {"s": hparams_seed}}
                        for i in range(N_ENVS):
                            for split in ("in", "out"):
                                rec[f"env{i}_{split}_acc"] = rng.choice((0.25, 0.5, 0.75))
                                if i in envs:
                                    for subset in SUBSETS:
                                        rec[f"env{i}_{split}_{subset}_acc"] = rng.random()
                                        rec[f"env{i}_{split}_{subset}_count"] = 3
                        records.append(rec)
    return records


def drop_unread(records, reads):
    """``records`` without every accuracy (and subset count) key outside ``reads``."""
    kept = []
    for rec in records:
        envs = rec["args"]["test_envs"]
        allowed = {(split, i) for split, role in reads.items()
                   for i in read_environments(role, envs, N_ENVS)}
        kept.append({k: v for k, v in rec.items()
                     if not k.startswith("env") or (k.split("_")[1], int(k[3])) in allowed})
    return kept


SINGLES_AND_PAIRS = [[i] for i in range(N_ENVS)] + [[i, j] for i in range(N_ENVS)
                                                   for j in range(i + 1, N_ENVS)]


@pytest.mark.parametrize("method", [IID, LOO, ORACLE], ids=lambda m: m.key)
@pytest.mark.parametrize("test_key", ["env{t}_in_acc", "env{t}_in_ip_acc"])
def test_domainbed_methods_read_only_what_they_declare(method, test_key):
    records = records_of(SINGLES_AND_PAIRS)
    full = select(frame_of(records), method, test_key)
    dropped = select(frame_of(drop_unread(records, method.reads)), method, test_key)
    assert len(full) == N_ENVS * 2 and not full["test_acc"].isna().any()
    pd.testing.assert_frame_equal(full, dropped)


@pytest.mark.parametrize("method", [IID, ORACLE], ids=lambda m: m.key)
def test_single_source_selection_reads_only_what_it_declares(method):
    records = records_of([[j for j in range(N_ENVS) if j != s] for s in range(N_ENVS)])
    reads = SELECTION_READS["single_source"][method.key]
    full = select_single_source(frame_of(records), method)
    dropped = select_single_source(frame_of(drop_unread(records, reads)), method)
    assert len(full) == N_ENVS * 2
    pd.testing.assert_frame_equal(full, dropped)


@pytest.mark.parametrize("method", [IID, ORACLE], ids=lambda m: m.key)
def test_udg_selection_reads_only_what_it_declares(method):
    records = records_of([[0, 3], [1]], fractions=(0.1, 1.0))
    reads = SELECTION_READS["udg"][method.key]
    full, dropped = (frame_of(r) for r in (records, drop_unread(records, reads)))
    full = select_udg(full[is_udg(full)], method)
    dropped = select_udg(dropped[is_udg(dropped)], method)
    assert len(full) == 2 * 2 * 2
    pd.testing.assert_frame_equal(full, dropped)


@pytest.mark.parametrize("kind, method", [("domainbed", IID), ("domainbed", ORACLE),
                                          ("domainbed", LOO), ("single_source", IID),
                                          ("udg", ORACLE)])
def test_methods_read_through_the_declaration(monkeypatch, kind, method):
    """Declaring that a method reads the validation split of no environment (the out-splits;
    leave-one-domain-out: the in-splits) makes it see none: its validation accuracies become
    missing (a method reading around the declaration would not notice)."""
    records = records_of(SINGLES_AND_PAIRS if kind == "domainbed" else
                         [[j for j in range(N_ENVS) if j != s] for s in range(N_ENVS)],
                         fractions=(0.5,) if kind == "udg" else (None,))
    frame = frame_of(records)

    def choose():
        if kind == "domainbed":
            return select(frame, method)
        if kind == "single_source":
            return select_single_source(frame, method)
        return select_udg(frame, method)

    before = choose()
    monkeypatch.setitem(SELECTION_READS[kind][method.key], "in" if method is LOO else "out",
                        None)
    after = choose()
    assert not before["val_acc"].isna().any()
    assert after.empty if method is LOO else after["val_acc"].isna().all()


def test_environment_count_counts_out_splits_too():
    """A record of ``--eval_splits selection`` has its test environment's in-split only: the
    environments of a dataset the catalog does not know are still all counted."""
    records = drop_unread(records_of([[2]]), {"out": "all", "in": TEST})
    assert "env0_in_acc" not in records[0]
    frame = frame_of(records)
    assert "env0_in_acc" not in frame and environment_count(frame) == N_ENVS
