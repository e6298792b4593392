"""What a run may use (its CPU cores, its torch device) and how a command starts (the garbage
collector paused, one line for an interpreter without the requirements). Torch-free at import."""

from __future__ import annotations

import contextlib
import gc
import os
import shlex
import sys

#: The cores a launcher gives each job it runs (a user may set it too, to leave cores free).
CORES_ENV = "DG_PLUGINS_CPUS"


def job_cores() -> tuple[int, str]:
    """The CPU cores this job may use and where that came from: ``$DG_PLUGINS_CPUS`` (a
    launcher's share), Slurm's ``SLURM_CPUS_PER_TASK``, else the process's CPU affinity."""
    for name, source in ((CORES_ENV, f"${CORES_ENV}"),
                         ("SLURM_CPUS_PER_TASK", "Slurm's cpus-per-task")):
        if text := os.environ.get(name, "").strip():
            with contextlib.suppress(ValueError):
                if (cores := int(text)) >= 1:
                    return cores, source
            raise ValueError(f"${name}={text!r} is not a positive number of CPU cores; set it to "
                             f"one (e.g. {name}=4) or unset it")
    try:
        return len(os.sched_getaffinity(0)), "the cores this process may run on"
    except (AttributeError, OSError):
        return os.cpu_count() or 1, "the machine's cores"


def pick_device(name: str | None = None):
    """``torch.device(name)``, or cuda when available, else cpu; a missing cuda raises the fix."""
    import torch

    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r} is not a torch device ({err}); use cpu, cuda or "
                         "cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r} asked for CUDA but no CUDA device is available; "
                         "use --device cpu (or leave --device out to pick automatically)")
    return device


def pause_collector() -> None:
    """Python's cyclic garbage collector off during a command's start-up (importing torch makes some
    400,000 long-lived objects it would traverse again and again) until :func:`resume_collector`."""
    gc.disable()


def resume_collector() -> None:
    """The collector on again with everything alive frozen (``gc.freeze``), once; nothing when it
    is on (a command called in-process)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def requirement_line(name: str, err: BaseException) -> str:
    """The error for an interpreter without ``name``: the command installing dg_plugins into it."""
    exe = shlex.quote(sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    package = shlex.quote(root) if os.path.isfile(os.path.join(root, "setup.cfg")) else \
        "dg_plugins"
    return (f"{exe} cannot import {name} ({err}), which dg_plugins needs: install the package "
            f"into it ({exe} -m pip install -e {package}), or run the interpreter that has it "
            "(sweeps/*.sh: PYTHON=.venv/bin/python)")


def missing_requirement(err: ModuleNotFoundError) -> int:
    """Print :func:`requirement_line` and return 2; re-raise when ``err`` is dg_plugins' own."""
    name = (err.name or "dg_plugins").split(".")[0]
    if name == "dg_plugins":
        raise err
    print(f"error: {requirement_line(name, err)}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def swapped(owner, name: str, value):
    """``owner.name`` (a module's global too) set to ``value`` inside the block, then restored."""
    previous = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield value
    finally:
        setattr(owner, name, previous)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except OSError as err:  # PermissionError: it exists
        return not isinstance(err, ProcessLookupError)
    return True
