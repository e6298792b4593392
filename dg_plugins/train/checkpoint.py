"""A train job's resume file (``checkpoint.pt``, written at each record): model, optimizers,
schedulers, streams, RNG states, fp16's scaler, and the args and hparams that wrote them, so that
``--resume`` continues exactly, refuses another configuration, and names a damaged file."""

from __future__ import annotations

import os
import zipfile

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


def save_checkpoint(job, next_step: int) -> None:
    """Write ``job``'s resume file (``grad_scaler``: fp16's scaler's state, when there is one)."""
    algorithm = job.algorithm
    extra = {} if job.scaler is None else {"grad_scaler": job.scaler.state_dict()}
    if hasattr(algorithm, "resume_state"):  # Python state beside the state_dict (DomainBed's)
        extra["algorithm_state"] = algorithm.resume_state()
    atomic_torch_save({
        "next_step": next_step, "model": algorithm.state_dict(),
        "optimizers": {n: o.state_dict() for n, o in algorithm.optimizers().items()},
        "schedulers": {n: s.state_dict() for n, s in algorithm.schedulers().items()},
        "streams": [s.state_dict() for s in job.streams], "rng": rng_state(),
        "n_records": job.n_records, "last_keys": job.last_keys, "accumulated": job.accumulated,
        "args": job.record_args, "hparams": job.hparams, **extra,
    }, job.checkpoint_path)


def checkpoint_damage(path: str) -> str | None:
    """Why ``path`` cannot be read back (not a complete ``torch.save`` zip whose members match
    their CRCs), or None; reads it once without unpickling."""
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


def damaged(path: str, damage: str, fix: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(f"{path} is damaged and cannot be resumed from: {damage}. Nothing "
                             f"was changed. {fix}.")


def check_checkpoint_file(path: str, fix: str) -> None:
    """Raise :class:`DamagedCheckpoint` (with ``fix``) when ``path`` exists and is damaged."""
    if os.path.exists(path) and (damage := checkpoint_damage(path)) is not None:
        raise damaged(path, damage, fix)


def read_checkpoint(path: str, fix: str = RESTART_FIX, device=None) -> dict:
    """The checkpoint ``path``, loaded once: what was saved from the CPU stays there (RNG states,
    a class's CPU tensors), what was on a GPU comes to ``device`` (default: the CPU); one that
    cannot be loaded raises :class:`DamagedCheckpoint`, OSErrors propagate."""
    placement = "cpu" if device is None or device.type == "cpu" else (
        lambda storage, saved_on: storage if saved_on == "cpu" else storage.to(device=device))
    try:
        state = torch.load(path, map_location=placement, weights_only=False)
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
    raise damaged(path, " ".join(str(damage).split())[:800], fix)


def restore_checkpoint(job) -> dict:
    """Load ``job``'s checkpoint into its model, streams, RNGs and scaler and return it; another
    configuration raises JobStateError, a misfit :class:`DamagedCheckpoint` (nothing changed)."""
    path, fix, algorithm = job.checkpoint_path, job.checkpoint_fix, job.algorithm
    state = read_checkpoint(path, fix, job.device)
    if diffs := checkpoint_differences(state, job.record_args, job.hparams):
        raise JobStateError("--resume with other arguments than the interrupted run would mix "
                            "two configurations in one results file:\n  " + "\n  ".join(diffs)
                            + "\nRerun with the original arguments, or start over with --force.")
    try:
        if hasattr(algorithm, "load_resume_state"):  # before the state_dict: buffers' shapes
            algorithm.load_resume_state(state["algorithm_state"], state["model"])
        algorithm.load_state_dict(state["model"])
        for key in ("optimizers", "schedulers"):
            for name, part in getattr(algorithm, key)().items():
                part.load_state_dict(state[key][name])
        for stream, s in zip(job.streams, state["streams"]):
            stream.load_state_dict(s)
        set_rng_state(state["rng"])
        if job.scaler is not None:
            job.scaler.load_state_dict(state["grad_scaler"])
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as err:
        reason = " ".join(str(err).split())
        raise DamagedCheckpoint(f"{path} does not fit this job's model and cannot be resumed "
                                f"from (written by an incompatible version?): {type(err).__name__}"
                                f": {reason[:500]}. Nothing was changed on disk. {fix}.") from None
    return state


def _shown(args: dict, key: str) -> tuple[str, str]:
    """``(value, note)`` of flag ``key`` in ``args`` as a difference names it."""
    if args.get(key) is not None:
        return repr(args[key]), ""
    if key in ROWS and ROWS[key].records == NOT_DEFAULT:
        return repr(ROWS[key].default), " (the default)"
    return "not given", ""


def checkpoint_differences(state: dict, record_args: dict, hparams: dict) -> list[str]:
    """What differs between the checkpoint's run and this command (but resumable flags). An
    hparam the checkpoint lacks (added since) is unchanged when it is now at its default."""
    old_args, old_hparams = state.get("args"), state.get("hparams")
    if old_args is None or old_hparams is None:  # an older checkpoint without its arguments
        return []
    diffs = []
    for key in sorted(set(old_args) | set(record_args)):
        if not (key in ROWS and ROWS[key].resumable) and old_args.get(key) != record_args.get(key):
            (old, old_note), (new, new_note) = _shown(old_args, key), _shown(record_args, key)
            diffs.append(f"--{key}: {old} in the checkpoint{old_note}, {new} now{new_note}")
    added = set(hparams) - set(old_hparams)
    defaults = hparams_lib.default_hparams(record_args.get("algorithm"),
                                           record_args.get("dataset")) if added else {}
    for key in sorted(set(old_hparams) | set(hparams)):
        if key in added and key in defaults and hparams[key] == defaults[key]:
            continue  # added after that checkpoint was written, left at its default
        if old_hparams.get(key) != hparams.get(key):
            diffs.append(f"hparam {key}: {old_hparams.get(key)!r} in the checkpoint, "
                         f"{hparams.get(key)!r} now")
    return diffs
