"""The resume file of a train job (``checkpoint.pt``): model, optimizers, LR schedulers, batch
streams, RNG states and fp16's gradient scaler, with the arguments and hparams that wrote them, so
that ``--resume`` continues exactly and refuses another configuration, and a damaged file is
named, with its fix, before anything changes. (A record's "checkpoint" is a step that writes a
record; this file is written at each.)"""

from __future__ import annotations

import os

import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.files import atomic_torch_save
from dg_plugins.job.flags import NOT_DEFAULT, ROWS
from dg_plugins.job.folder import JobStateError
from dg_plugins.seeds import rng_state, set_rng_state

#: What to do about a train job's checkpoint that cannot be resumed from (train's ``--resume``).
RESTART_FIX = ("Start the job over with --force (its records, models and checkpoint are removed "
               "first), or move the folder away")
#: The bookkeeping every checkpoint holds (:func:`save_checkpoint`).
CHECKPOINT_KEYS = ("next_step", "model", "optimizers", "schedulers", "streams", "rng",
                   "n_records", "last_keys")


def save_checkpoint(path: str, *, next_step: int, algorithm, streams, n_records: int,
                    last_keys, accumulated: dict, record_args: dict, hparams: dict,
                    scaler=None) -> None:
    """Write the resume file; ``scaler``: fp16's ``GradScaler`` (its scale and growth tracker
    are saved under ``grad_scaler``; absent without one)."""
    extra = {} if scaler is None else {"grad_scaler": scaler.state_dict()}
    if hasattr(algorithm, "resume_state"):  # Python state beside the state_dict (DomainBed's)
        extra["algorithm_state"] = algorithm.resume_state()
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
        **extra,
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


def read_checkpoint(path: str, fix: str = RESTART_FIX) -> dict:
    """The checkpoint ``path`` as saved, loaded once (on CPU: RNG states must stay CPU
    ByteTensors). A file that cannot be loaded raises :class:`DamagedCheckpoint` naming the file,
    why (:func:`checkpoint_damage` when the archive itself is damaged; else the unpickling error,
    e.g. of a file written by an incompatible version, or the keys a checkpoint must hold), and
    ``fix``; nothing is changed on disk. Errors of the file system (OSError) propagate."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001  (unpickling may raise anything a constructor does)
        damage = checkpoint_damage(path) or (
            "it cannot be unpickled (written by an incompatible version of dg_plugins, torch or "
            f"a plugin?): {type(err).__name__}: {err}")
    else:
        missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
        if not missing:
            return state
        damage = (f"it is not a train checkpoint (it lacks {', '.join(missing)}; written by an "
                  "incompatible version?)")
    raise DamagedCheckpoint(f"{path} is damaged and cannot be resumed from: "
                            f"{' '.join(str(damage).split())[:800]}. Nothing was changed. {fix}.")


def apply_checkpoint(state: dict, algorithm, streams, path: str = "the checkpoint",
                     fix: str = RESTART_FIX, scaler=None) -> None:
    """Restore the algorithm, optimizers, schedulers, streams, RNG states and ``scaler`` (fp16's
    gradient scaler, when the job has one) from ``state`` (:func:`read_checkpoint`); state that
    does not fit them (written by an incompatible version of the algorithm) raises
    :class:`DamagedCheckpoint`."""
    try:
        if hasattr(algorithm, "load_resume_state"):  # before the state_dict: buffers' shapes
            algorithm.load_resume_state(state["algorithm_state"], state["model"])
        algorithm.load_state_dict(state["model"])
        for name, opt in algorithm.optimizers().items():
            opt.load_state_dict(state["optimizers"][name])
        for name, scheduler in algorithm.schedulers().items():
            scheduler.load_state_dict(state["schedulers"][name])
        for stream, s in zip(streams, state["streams"]):
            stream.load_state_dict(s)
        set_rng_state(state["rng"])
        if scaler is not None:
            scaler.load_state_dict(state["grad_scaler"])
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as err:
        reason = " ".join(str(err).split())
        raise DamagedCheckpoint(
            f"{path} does not fit this job's model and cannot be resumed from (written by an "
            f"incompatible version?): {type(err).__name__}: {reason[:500]}. Nothing was "
            f"changed on disk. {fix}.") from None


def flag_value(args: dict, key: str) -> tuple[str, str]:
    """``(value, note)`` of flag ``key`` in a job's ``args``, as a resume difference names it:
    the value given, or for a flag left out at its default (records: "not default" in
    :data:`dg_plugins.job.flags.FLAGS`) the default with the note `` (the default)``; any other
    flag not given is ``not given``."""
    value = args.get(key)
    if value is not None:
        return repr(value), ""
    if key in ROWS and ROWS[key].records == NOT_DEFAULT:
        return repr(ROWS[key].default), " (the default)"
    return "not given", ""


def checkpoint_differences(state: dict, record_args: dict, hparams: dict) -> list[str]:
    """What differs between the run that wrote the checkpoint and this command (paths that may
    move: the flags the table marks resumable, excluded).

    An hparam the checkpoint lacks (it was written by a release before that hparam existed, e.g.
    ``batch_sampling``, ``lr_schedule`` or a dataset's ``augmentation``) counts as unchanged when
    its value now is its default for the job's algorithm and dataset
    (:func:`dg_plugins.hparams.default_hparams`): the default is what that release did."""
    old_args, old_hparams = state.get("args"), state.get("hparams")
    if old_args is None or old_hparams is None:  # an older checkpoint without its arguments
        return []
    diffs = []
    for key in sorted(set(old_args) | set(record_args)):
        if key in ROWS and ROWS[key].resumable:
            continue
        if old_args.get(key) != record_args.get(key):
            old, new = (flag_value(args, key) for args in (old_args, record_args))
            diffs.append(f"--{key}: {old[0]} in the checkpoint{old[1]}, {new[0]} now{new[1]}")
    defaults = None
    for key in sorted(set(old_hparams) | set(hparams)):
        if key not in old_hparams and key in hparams:
            if defaults is None:
                defaults = hparams_lib.default_hparams(record_args.get("algorithm"),
                                                       record_args.get("dataset"))
            if key in defaults and hparams[key] == defaults[key]:
                continue  # added after that checkpoint was written, left at its default
        if old_hparams.get(key) != hparams.get(key):
            diffs.append(f"hparam {key}: {old_hparams.get(key)!r} in the checkpoint, "
                         f"{hparams.get(key)!r} now")
    return diffs

