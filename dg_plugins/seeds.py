"""Seeds and random state: DomainBed's seed derivation, seeding every RNG of a job, saving and
restoring their states (the resume file), a block with RNGs of its own, deterministic algorithms.
Torch-free at import."""

from __future__ import annotations

import contextlib
import hashlib
import random

import numpy as np


def seed_hash(*args) -> int:
    """An int in [0, 2**31) from the md5 of the arguments' repr, as DomainBed's ``seed_hash``."""
    return int(hashlib.md5(str(args).encode("utf-8")).hexdigest(), 16) % (2**31)


def seed_everything(seed: int) -> None:
    """Seed ``random``, numpy and torch, and make cuDNN deterministic (DomainBed's train.py)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def rng_state(cuda: bool = True) -> dict:
    """The states of ``random``, numpy, torch's CPU generator and (``cuda``) every CUDA one."""
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the states :func:`rng_state` returned."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Run the block with torch's CPU, ``random`` and numpy RNGs seeded, then restore them."""
    import torch

    state = rng_state(cuda=False)  # no CUDA state: it is not seeded here
    try:
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)
        yield
    finally:
        set_rng_state(state)


@contextlib.contextmanager
def deterministic_algorithms():
    """Within the block, ``torch.use_deterministic_algorithms(True, warn_only=True)``."""
    import torch

    previous = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
