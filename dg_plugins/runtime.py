"""What a run may use: its CPU cores (:func:`job_cores`: a launcher's share, Slurm's
cpus-per-task, or the process's CPU affinity) and its torch device (train, the CLIP scorer,
alignment_eval, the benchmarks); and how a command starts (:func:`pause_collector`, and one line
for an interpreter without the package's requirements). No torch import at module import."""

from __future__ import annotations

import gc
import os
import shlex
import sys

#: The cores a launcher gives each job it runs (the ``multi_gpu`` launcher: the machine's cores
#: divided among the jobs it runs at once); a user may set it too, e.g. to leave cores free.
CORES_ENV = "DG_PLUGINS_CPUS"


def job_cores() -> tuple[int, str]:
    """The CPU cores this process's job may use, and where that number came from:
    ``$DG_PLUGINS_CPUS`` (a launcher's share), Slurm's ``SLURM_CPUS_PER_TASK`` (submitit), else
    the cores the process may run on (its CPU affinity, which taskset and cgroups restrict)."""
    for name, source in ((CORES_ENV, f"${CORES_ENV}"),
                         ("SLURM_CPUS_PER_TASK", "Slurm's cpus-per-task")):
        text = os.environ.get(name, "").strip()
        if text:
            try:
                cores = int(text)
            except ValueError:
                cores = 0
            if cores < 1:
                raise ValueError(f"${name}={text!r} is not a positive number of CPU cores; set "
                                 f"it to one (e.g. {name}=4) or unset it")
            return cores, source
    try:
        return len(os.sched_getaffinity(0)), "the cores this process may run on"
    except (AttributeError, OSError):
        return os.cpu_count() or 1, "the machine's cores"


def pick_device(name: str | None = None):
    """``torch.device(name)``, or cuda when available and cpu otherwise. A cuda device asked for on
    a machine without one raises with the fix, instead of failing at the first tensor move."""
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
    """Start-up of a command (train, sweep, reproduce, the fork server's preload): Python's cyclic
    garbage collector off while it imports torch (some 400,000 long-lived objects, with
    ``torch._dynamo``) and plans, which its collections would otherwise traverse again and again
    (importing both: 2.1 CPU-s with the collector on, 1.65 off, on a 2-core Xeon), until
    :func:`resume_collector`. Nothing computed changes."""
    gc.disable()


def resume_collector() -> None:
    """Where a command's long part begins (a job's first step, a sweep's launch): the collector
    on again with everything alive frozen (``gc.freeze``: left out of its collections, and of a
    forked child's). Once; nothing when the collector is on (a command called in-process)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def requirement_line(name: str, err: BaseException) -> str:
    """The error for an interpreter that cannot import ``name``, which dg_plugins needs (a script
    run with another ``PYTHON``): it names the interpreter and the command that installs the
    package into it."""
    exe = shlex.quote(sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    package = shlex.quote(root) if os.path.isfile(os.path.join(root, "setup.cfg")) else \
        "dg_plugins"
    return (f"{exe} cannot import {name} ({err}), which dg_plugins needs: install the package "
            f"into it ({exe} -m pip install -e {package}), or run the interpreter that has it "
            "(sweeps/*.sh: PYTHON=.venv/bin/python)")


def missing_requirement(err: ModuleNotFoundError) -> int:
    """A command's modules failed to import ``err.name``: print :func:`requirement_line` and
    return the exit status 2; re-raise when the module is dg_plugins' own (a bug, shown in full)."""
    name = (err.name or "dg_plugins").split(".")[0]
    if name == "dg_plugins":
        raise err
    print(f"error: {requirement_line(name, err)}", file=sys.stderr)
    return 2
