"""Checkpoints of a train job (``checkpoint.pt``): model, optimizers, LR schedulers, batch
streams and RNG states, with the arguments and hparams that wrote them, so that ``--resume``
continues exactly and refuses another configuration; and the seeding of a job's RNGs."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from dg_plugins.engine.job_folder import JobStateError
from dg_plugins.files import atomic_torch_save

#: Record args that may differ between a checkpoint and the resuming command (paths).
RESUMABLE_ARG_CHANGES = ("output_dir", "data_dir")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])



def save_checkpoint(path: str, *, next_step: int, algorithm, streams, n_records: int,
                    last_keys, accumulated: dict, record_args: dict, hparams: dict) -> None:
    atomic_torch_save({
        "next_step": next_step,
        "model": algorithm.state_dict(),
        "optimizers": {n: o.state_dict() for n, o in algorithm.optimizers().items()},
        "schedulers": {n: s.state_dict() for n, s in algorithm.schedulers().items()},
        "streams": [s.state_dict() for s in streams],
        "rng": rng_state(),
        "n_records": n_records,
        "last_keys": last_keys,
        "accumulated": accumulated,
        "args": record_args,
        "hparams": hparams,
    }, path)


def checkpoint_damage(path: str) -> str | None:
    """Why the checkpoint file ``path`` cannot be read back, or None when it is intact: it must
    be a complete zip archive (``torch.save``'s format) whose every member matches its CRC, with
    the pickle torch writes. Reads the file once without unpickling or building tensors."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            bad = archive.testzip()
    except zipfile.BadZipFile as err:
        return f"not a complete torch archive ({err}; the file has {os.path.getsize(path)} bytes)"
    except (OSError, EOFError, ValueError, RuntimeError) as err:  # zlib errors, truncated members
        return f"unreadable ({type(err).__name__}: {err})"
    if bad is not None:
        return f"member {bad} fails its CRC check (the file was changed after it was written)"
    if not any(name == "data.pkl" or name.endswith("/data.pkl") for name in names):
        return "the archive holds no data.pkl (not written by torch.save)"
    return None


class DamagedCheckpoint(JobStateError):
    """A checkpoint file that cannot be read back; the message names it, why, and the fix."""


def check_checkpoint_file(path: str, fix: str) -> None:
    """Raise :class:`DamagedCheckpoint` (``fix``: what to do, e.g. ``--force``) when ``path``
    exists and :func:`checkpoint_damage` finds it damaged; nothing is changed on disk."""
    if not os.path.exists(path):
        return
    damage = checkpoint_damage(path)
    if damage is not None:
        raise DamagedCheckpoint(f"{path} is damaged and cannot be resumed from: {damage}. "
                                f"Nothing was changed. {fix}.")


def load_checkpoint(path: str, algorithm, streams) -> dict:
    """Restore the algorithm, optimizers, schedulers, streams and RNG states from ``path``; returns
    the checkpoint's bookkeeping (``next_step``, ``n_records``, ``last_keys``, ``accumulated``)."""
    # CPU: RNG states must stay CPU ByteTensors; load_state_dict copies onto the model's device
    state = torch.load(path, map_location="cpu", weights_only=False)
    algorithm.load_state_dict(state["model"])
    for name, opt in algorithm.optimizers().items():
        opt.load_state_dict(state["optimizers"][name])
    for name, scheduler in algorithm.schedulers().items():
        scheduler.load_state_dict(state["schedulers"][name])
    for stream, s in zip(streams, state["streams"]):
        stream.load_state_dict(s)
    set_rng_state(state["rng"])
    return state


def checkpoint_differences(state: dict, record_args: dict, hparams: dict) -> list[str]:
    """What differs between the run that wrote the checkpoint and this command (paths that may
    move, :data:`RESUMABLE_ARG_CHANGES`, excluded)."""
    old_args, old_hparams = state.get("args"), state.get("hparams")
    if old_args is None or old_hparams is None:  # an older checkpoint without its arguments
        return []
    diffs = []
    for key in sorted(set(old_args) | set(record_args)):
        if key in RESUMABLE_ARG_CHANGES:
            continue
        if old_args.get(key) != record_args.get(key):
            diffs.append(f"--{key}: {old_args.get(key)!r} in the checkpoint, "
                         f"{record_args.get(key)!r} now")
    for key in sorted(set(old_hparams) | set(hparams)):
        if old_hparams.get(key) != hparams.get(key):
            diffs.append(f"hparam {key}: {old_hparams.get(key)!r} in the checkpoint, "
                         f"{hparams.get(key)!r} now")
    return diffs
