"""What model selection reads from a job's records (:data:`SELECTION_READS`, read by collect's
methods) and the splits a job evaluates (:func:`evaluated_splits`). Torch-free."""

from __future__ import annotations

#: A record key's part: a test environment's IP/OOP subset of its out split cut to the items outside
#: its in split, recorded only when the two share items (PACS's official target split), so that
#: pooling the two counts each image once.
OUTSIDE_IN_SUBSET = "{subset}_outside_in"

#: ``--eval_splits``: ``all`` (DomainBed's; the default, left out of the args, so hashes stay
#: DomainBed's) or ``selection``, the splits model selection reads.
EVAL_SPLITS = ("all", "selection")
DEFAULT_EVAL_SPLITS = "all"
#: The record key listing the splits a ``selection`` record evaluated.
EVALUATED_KEY = "evaluated_splits"

#: Which environments of a record a read names: its test environments, the others, or all.
TEST, TRAIN, ALL = "test", "train", "all"

#: Per kind of record and model-selection method, the environments whose split keys it reads
#: (``in``: ``env{i}_in_acc`` and keys derived from it, e.g. ``env{i}_in_ip_acc``; ``out``).
#: The tests drop every key outside a method's declaration and check its selection is unchanged.
#: ``domainbed`` (``domainbed/model_selection.py``): the methods count environments by probing
#: ``env{i}_out_acc`` (hence every out split) and read the test environments' in splits (LODO's
#: pair runs too). ``single_source`` and ``udg`` (:mod:`dg_plugins.collect`): every out split and
#: the targets' in splits. No method reads a training environment's in split.
SELECTION_READS: dict[str, dict[str, dict[str, str]]] = {
    "domainbed": {"iid": {"out": ALL, "in": TEST}, "oracle": {"out": TEST, "in": TEST},
                  "loo": {"out": ALL, "in": TEST}},
    "single_source": {"iid": {"out": ALL, "in": TEST}, "oracle": {"out": ALL, "in": TEST}},
    "udg": {"iid": {"out": ALL, "in": TEST}, "oracle": {"out": ALL, "in": TEST}},
}


def single_source_of(test_envs, n_envs: int) -> int:
    """The one training environment of a single-source record (``n_envs >= 3``), else -1 (with
    3 environments it is also a leave-one-domain-out pair run)."""
    left = set(range(n_envs)) - set(test_envs)
    return left.pop() if n_envs >= 3 and len(test_envs) == n_envs - 1 and len(left) == 1 else -1


def record_kinds(test_envs, n_envs: int, udg: bool = False) -> tuple[str, ...]:
    """The kinds of :data:`SELECTION_READS` whose methods read a job's records."""
    if udg:
        return ("udg",)
    return ("domainbed",) + (("single_source",) if single_source_of(test_envs, n_envs) >= 0
                             else ())


def read_environments(role: str, test_envs, n_envs: int) -> list[int]:
    if role not in (TEST, TRAIN, ALL):
        raise ValueError(f"unknown read role {role!r}; expected one of {TEST, TRAIN, ALL}")
    tests = set(int(t) for t in test_envs)
    return [i for i in range(n_envs) if role == ALL or (i in tests) == (role == TEST)]


def evaluated_splits(eval_splits: str, test_envs, n_envs: int, uda: int = 0,
                     udg: bool = False) -> list[str]:
    """The splits a job evaluates at every record, in DomainBed's names and order (``uda``: how
    many uda splits); ``selection``: what its kinds' methods read, and the (cheap) uda splits."""
    if eval_splits not in EVAL_SPLITS:
        raise ValueError(f"--eval_splits must be one of {', '.join(EVAL_SPLITS)}, got "
                         f"{eval_splits!r}")
    reads = [{"in": ALL, "out": ALL}] if eval_splits == "all" else [
        read for kind in record_kinds(test_envs, n_envs, udg)
        for read in SELECTION_READS[kind].values()]
    wanted = {(split, i) for read in reads for split, role in read.items()
              for i in read_environments(role, test_envs, n_envs)}
    return [f"env{i}_{split}" for split in ("in", "out") for i in range(n_envs)
            if (split, i) in wanted] + [f"env{k}_uda" for k in range(uda)]
