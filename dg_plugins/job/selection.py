"""What model selection reads from a job's records (:data:`SELECTION_READS`, the one declaration
behind ``--eval_splits selection``: collect's methods read through it, train evaluates the union),
and the splits a job evaluates (:func:`evaluated_splits`). Torch-free."""

from __future__ import annotations

#: Ours, a record key's part: a named subset (IP, OOP) of a test environment's out split cut down
#: to the items outside its in split, recorded as ``env{i}_out_<subset>_outside_in_{acc,count}``
#: only when the two splits share items (a predefined split: PACS's official target out split
#: lies inside its in split), so that pooling the two splits counts each image once.
OUTSIDE_IN_SUBSET = "{subset}_outside_in"

#: ``--eval_splits`` values: ``all`` evaluates every split at every record (DomainBed's train.py);
#: ``selection`` only the splits that model selection reads (:func:`evaluated_splits`).
EVAL_SPLITS = ("all", "selection")
#: The default, DomainBed's behaviour. A record's ``args`` hold ``eval_splits`` only when it is
#: not this, so the args, commands and job-folder hashes of ``all`` stay DomainBed's.
DEFAULT_EVAL_SPLITS = "all"
#: The record key that lists the splits a ``selection`` record evaluated (``env0_out``, ...); a
#: record without it evaluated every split (DomainBed's records, ``--eval_splits all``).
EVALUATED_KEY = "evaluated_splits"

#: Which environments of a record a read names: its test environments (``args.test_envs``), the
#: others (its training environments), or every one.
TEST, TRAIN, ALL = "test", "train", "all"

#: The accuracy keys each model-selection method reads, per kind of record, as data: for each
#: split (``in``: ``env{i}_in_acc``, ``out``: ``env{i}_out_acc``, and the keys derived from a split,
#: e.g. the IP/OOP ``env{i}_in_ip_acc``), the environments whose key the method reads. Declared
#: once, here in the job-folder contract (record keys are part of it), because two sides use it:
#: collect's methods read every key through it (:mod:`dg_plugins.collect.selection`, ``.udg``,
#: ``.single_source``: a key outside a method's declaration reads as missing there), and train's
#: ``--eval_splits selection`` evaluates exactly the union of what the methods of the job's kind
#: read (:func:`evaluated_splits`). The tests drop every key outside a method's declaration
#: and check that its selection is unchanged, which keeps this table true.
#:
#: * ``domainbed`` (``domainbed/model_selection.py``): training-domain validation reads the
#:   training environments' out-splits and counts the environments by probing ``env{i}_out_acc``
#:   until one is missing (hence every out-split), and the test environment's in-split; the
#:   oracle reads the test environment's out- and in-split; leave-one-domain-out counts the
#:   environments on the out-splits too and reads the in-splits of the pair runs' test
#:   environments ``[t, j]`` (the held-out j) and of the single run's t.
#: * ``single_source`` (:mod:`dg_plugins.collect.single_source`): every out-split (the source's
#:   for training-domain validation and its table column, the targets' for the oracle, all of
#:   them to count the environments) and the targets' (test environments') in-splits.
#: * ``udg`` (:mod:`dg_plugins.collect.udg`): the same, several sources.
#:
#: No method reads a training environment's in-split (60-67% of a DomainBed job's images).
SELECTION_READS: dict[str, dict[str, dict[str, str]]] = {
    "domainbed": {
        "iid": {"out": ALL, "in": TEST},
        "oracle": {"out": TEST, "in": TEST},
        "loo": {"out": ALL, "in": TEST},
    },
    "single_source": {
        "iid": {"out": ALL, "in": TEST},
        "oracle": {"out": ALL, "in": TEST},
    },
    "udg": {
        "iid": {"out": ALL, "in": TEST},
        "oracle": {"out": ALL, "in": TEST},
    },
}


def single_source_of(test_envs, n_envs: int) -> int:
    """The one training environment of a single-source record (``test_envs`` leave exactly one
    of ``n_envs >= 3`` environments), or -1 for another kind of record. On a 3-environment dataset
    such a record is also a leave-one-domain-out pair run: it is of both kinds."""
    left = set(range(n_envs)) - set(test_envs)
    return left.pop() if n_envs >= 3 and len(test_envs) == n_envs - 1 and len(left) == 1 else -1


def record_kinds(test_envs, n_envs: int, udg: bool = False) -> tuple[str, ...]:
    """The kinds of :data:`SELECTION_READS` whose methods read a job's records: ``udg`` for a UDG
    job (``--label_fraction``; collect reads its records with the UDG selection only), else
    ``domainbed``, and ``single_source`` too when it has one training environment
    (:func:`single_source_of`)."""
    if udg:
        return ("udg",)
    return ("domainbed",) + (("single_source",) if single_source_of(test_envs, n_envs) >= 0
                             else ())


def read_environments(role: str, test_envs, n_envs: int) -> list[int]:
    """The environments a read of ``role`` (:data:`TEST`, :data:`TRAIN`, :data:`ALL`) names in a
    record of ``test_envs`` among ``n_envs``."""
    if role not in (TEST, TRAIN, ALL):
        raise ValueError(f"unknown read role {role!r}; expected one of {TEST, TRAIN, ALL}")
    tests = set(int(t) for t in test_envs)
    return [i for i in range(n_envs)
            if role == ALL or (i in tests) == (role == TEST)]


def evaluated_splits(eval_splits: str, test_envs, n_envs: int, uda: int = 0,
                     udg: bool = False) -> list[str]:
    """The splits a job evaluates at every record, named as DomainBed's train.py names them
    (``env{i}_in``, ``env{i}_out``, ``env{k}_uda``) and in its order (every in, every out, then
    the uda splits by position). ``uda``: how many uda splits the job has (non-empty ones of its
    test environments); ``udg``: a UDG job.

    ``all``: every split. ``selection``: the union, over the methods of every kind of the job's
    records (:func:`record_kinds`), of the keys they read (:data:`SELECTION_READS`): every
    out-split and the test environments' in-splits, so the training environments' in-splits are
    skipped; and the uda splits, which no method reads but which are a test environment's own
    data (DomainBed carves them out of its in-split) and cost at most ``uda_holdout_fraction`` of
    it. Torch-free: reproduce counts a job's evaluation cost with it before launching."""
    if eval_splits not in EVAL_SPLITS:
        raise ValueError(f"--eval_splits must be one of {', '.join(EVAL_SPLITS)}, got "
                         f"{eval_splits!r}")
    wanted: dict[str, set[int]] = {"in": set(), "out": set()}
    if eval_splits == "all":
        wanted = {split: set(range(n_envs)) for split in wanted}
    else:
        for kind in record_kinds(test_envs, n_envs, udg):
            for reads in SELECTION_READS[kind].values():
                for split, role in reads.items():
                    wanted[split].update(read_environments(role, test_envs, n_envs))
    names = [f"env{i}_{split}" for split in ("in", "out") for i in range(n_envs)
             if i in wanted[split]]
    return names + [f"env{k}_uda" for k in range(uda)]
