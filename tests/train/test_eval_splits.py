"""``--eval_splits``: which splits a job evaluates (:func:`dg_plugins.train.folder.evaluated_splits`,
derived from the declaration of what model selection reads, :data:`SELECTION_READS`)."""

import pytest

from dg_plugins.train.folder import SELECTION_READS, evaluated_splits, record_kinds


def test_all_is_every_split_in_domainbeds_order():
    assert evaluated_splits("all", [1], 3, uda=1) == [
        "env0_in", "env1_in", "env2_in", "env0_out", "env1_out", "env2_out", "env0_uda"]


@pytest.mark.parametrize("test_envs, n_envs, udg, expected_in", [
    ([0], 4, False, [0]),           # DomainBed's single test environment
    ([0, 2], 4, False, [0, 2]),     # a leave-one-domain-out pair run
    ([1, 2], 3, False, [1, 2]),     # a pair run that is also single-source (source 0)
    ([1, 2, 3, 4, 5], 6, False, [1, 2, 3, 4, 5]),  # single-source
    ([0, 5], 6, True, [0, 5]),      # UDG
])
def test_selection_skips_only_the_training_in_splits(test_envs, n_envs, udg, expected_in):
    names = evaluated_splits("selection", test_envs, n_envs, uda=len(test_envs), udg=udg)
    assert names == ([f"env{i}_in" for i in expected_in]
                     + [f"env{i}_out" for i in range(n_envs)]
                     + [f"env{k}_uda" for k in range(len(test_envs))])


def test_selection_is_the_union_of_the_declared_reads(monkeypatch):
    """Derived from the declaration, not a second copy: a method that read the training
    environments' in-splits would make selection evaluate them."""
    reads = {kind: {key: dict(value) for key, value in methods.items()}
             for kind, methods in SELECTION_READS.items()}
    reads["domainbed"]["oracle"]["in"] = "train"
    monkeypatch.setitem(SELECTION_READS, "domainbed", reads["domainbed"])
    assert evaluated_splits("selection", [0], 3) == [
        "env0_in", "env1_in", "env2_in", "env0_out", "env1_out", "env2_out"]


def test_record_kinds():
    assert record_kinds([0], 4) == ("domainbed",)
    assert record_kinds([1, 2, 3], 4) == ("domainbed", "single_source")
    assert record_kinds([1, 2, 3], 4, udg=True) == ("udg",)


def test_unknown_value_is_refused():
    with pytest.raises(ValueError, match="--eval_splits must be one of all, selection"):
        evaluated_splits("some", [0], 3)
