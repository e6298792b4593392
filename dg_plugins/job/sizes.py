"""A job's split sizes and record counts from image counts alone (train's rules, which reproduce
counts costs with); the holdout is DomainBed's ``misc.split_dataset``. Torch-free."""

from __future__ import annotations


def holdout_size(n: int, fraction: float) -> int:
    """The items of ``n`` held out by a ``fraction`` (an out split, a uda split)."""
    return int(n * fraction)


def in_split_size(n: int, holdout_fraction: float) -> int:
    return n - holdout_size(n, holdout_fraction)


def split_sizes(pairs, test_envs, uda_holdout_fraction: float = 0.0) -> dict[str, int]:
    """Every split's size by DomainBed's name and order, from each environment's (in, out)."""
    ins, outs, udas = {}, {}, []
    for e, (in_, out) in enumerate(pairs):
        uda = holdout_size(in_, uda_holdout_fraction or 0.0) if e in set(test_envs) else 0
        ins[f"env{e}_in"], outs[f"env{e}_out"] = in_ - uda, out
        udas.append(uda)
    udas = [uda for uda in udas if uda]  # an empty uda split is left out, as train does
    return {**ins, **outs, **{f"env{k}_uda": uda for k, uda in enumerate(udas)}}


def random_holdout_pairs(counts, holdout_fraction: float) -> list[tuple[int, int]]:
    return [(kept := in_split_size(n, holdout_fraction), n - kept) for n in counts]


def is_recorded(step: int, n_steps: int, checkpoint_freq: int) -> bool:
    return step % checkpoint_freq == 0 or step == n_steps - 1


def records_after(step: int, n_steps: int, checkpoint_freq: int) -> int:
    """How many records the steps after ``step`` write (``step`` -1: all of a job's)."""
    last = n_steps - 1
    if step >= last:
        return 0
    return last // checkpoint_freq - step // checkpoint_freq + (last % checkpoint_freq != 0)
