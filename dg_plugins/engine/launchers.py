"""Command launchers (``domainbed/command_launchers.py``): each is ``fn(commands: list[str]) -> None``.

Importing this module registers ``dummy``, ``local``, ``multi_gpu`` and ``submitit`` in
:data:`dg_plugins.registry.LAUNCHERS`. No launcher imports torch or submitit at module import.

Differences from DomainBed's launchers (``domainbed/command_launchers.py``):

* ``local`` reports progress, and at the end prints every failed job with its first error lines
  and its err.txt, then raises :class:`~dg_plugins.engine.processes.JobsFailed` (exit status 1;
  DomainBed ignores exit codes and ends with status 0); a failing job never stops the others.
* ``multi_gpu`` raises when no GPU is visible (DomainBed spins forever), passes the GPU through the
  environment rather than a command prefix, and reports failures like ``local``.
* ``submitit`` is new: one Slurm job array (or submitit's local/debug executor for testing),
  configured by :func:`configure_submitit` (the sweep's ``--slurm_*`` flags) or ``DG_SLURM_*``
  environment variables.

Stop signals: while ``local`` or ``multi_gpu`` run jobs, a stop signal is forwarded to the running
jobs, no further job starts, the jobs get a grace period to stop at a checkpoint, and the launcher
raises :class:`~dg_plugins.engine.processes.LaunchInterrupted` (see
:mod:`dg_plugins.engine.processes`; the submitit launcher's behaviour is described in
:mod:`dg_plugins.engine.submitit_launcher`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Callable, Sequence

from dg_plugins.engine.processes import (ErrorLogs, JobProcesses, LaunchInterrupted,
                                         report_exit_codes, report_interrupted)
from dg_plugins.engine.submitit_launcher import submitit_launcher
from dg_plugins.registry import LAUNCHERS


# --------------------------------------------------------------------------------------------
# dummy and local


def dummy_launcher(commands: list[str]) -> None:
    """Print ``Dummy launcher: <cmd>`` for each command; run nothing."""
    for command in commands:
        print(f"Dummy launcher: {command}")


def run_sequentially(commands: Sequence[str], progress: bool | None = None,
                     grace_period_s: float | None = None) -> list[int]:
    """Run each command through the shell, one after another; return the exit codes.

    Progress: a tqdm bar on stderr when ``progress`` (default: stderr is a terminal), otherwise a
    plain ``[i/N] <cmd>`` line on stdout before each job. A stop signal is forwarded to the
    running job; then no further job starts and :class:`LaunchInterrupted` is raised once the
    job has exited (see :class:`JobProcesses`; ``grace_period_s`` overrides
    :func:`stop_grace_period`).
    """
    if progress is None:
        progress = sys.stderr.isatty()
    codes: list[int] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(commands), desc="jobs", unit="job", file=sys.stderr)
    try:
        with JobProcesses(grace_period_s) as jobs:
            for i, command in enumerate(commands):
                if jobs.stopping:
                    break
                if not progress:
                    print(f"[{i + 1}/{len(commands)}] {command}", flush=True)
                proc = jobs.start(i, command)
                if proc is None:
                    break
                codes.append(jobs.wait(proc))
                if bar is not None:
                    bar.update()
            if jobs.stopping:
                raise jobs.interruption(commands, codes)
    finally:
        if bar is not None:
            bar.close()
    return codes


def local_launcher(commands: list[str]) -> None:
    """Run the commands serially on this machine; summarize failures at the end (raising
    :class:`~dg_plugins.engine.processes.JobsFailed` when a job failed). A stop signal ends the
    sweep after the running job stopped (see the module docstring)."""
    logs = ErrorLogs(commands)
    try:
        codes = run_sequentially(commands)
    except LaunchInterrupted as err:
        report_interrupted("local", commands, err)
        raise
    report_exit_codes("local", commands, codes, logs)


# --------------------------------------------------------------------------------------------
# multi_gpu


def visible_gpus() -> list[str]:
    """GPU ids from ``CUDA_VISIBLE_DEVICES`` (comma-split, empty entries dropped) when set, else
    ``range(torch.cuda.device_count())`` (torch imported only then)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [gpu.strip() for gpu in env.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_on_gpus(commands: Sequence[str], gpus: Sequence[str],
                poll_interval: float = 1.0, grace_period_s: float | None = None) -> list[int]:
    """Run the commands in order, at most one per GPU at a time, each with
    ``CUDA_VISIBLE_DEVICES=<its gpu>``; poll every ``poll_interval`` s; return the exit codes.
    A stop signal is forwarded to every running job and raises :class:`LaunchInterrupted` once
    they have exited (see :class:`JobProcesses`)."""
    gpus = list(gpus)
    if not gpus:
        raise RuntimeError(
            "multi_gpu launcher: no GPU visible (CUDA_VISIBLE_DEVICES is empty or "
            "torch.cuda.device_count() is 0); use the local launcher on CPU machines"
        )
    codes: list[int | None] = [None] * len(commands)
    running: dict[str, tuple[int, subprocess.Popen]] = {}
    pending = list(enumerate(commands))
    with JobProcesses(grace_period_s) as jobs:
        while (pending and not jobs.stopping) or running:
            for gpu, (index, proc) in list(running.items()):
                code = jobs.poll(proc)
                if code is not None:
                    codes[index] = code
                    del running[gpu]
            for gpu in gpus:
                if pending and gpu not in running and not jobs.stopping:
                    index, command = pending.pop(0)
                    print(f"[{index + 1}/{len(commands)}] GPU {gpu}: {command}", flush=True)
                    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
                    proc = jobs.start(index, command, env=env)
                    if proc is None:
                        pending.insert(0, (index, command))
                        break
                    running[gpu] = (index, proc)
            jobs.announce()
            if running:
                time.sleep(min(poll_interval, 0.1) if jobs.stopping else poll_interval)
        if jobs.stopping:
            raise jobs.interruption(commands, codes)
    return [int(code) for code in codes]


def multi_gpu_launcher(commands: list[str], gpus: Sequence[str] | None = None,
                       poll_interval: float = 1.0) -> None:
    """One job per visible GPU at a time (``gpus`` overrides :func:`visible_gpus`)."""
    gpus = visible_gpus() if gpus is None else gpus
    logs = ErrorLogs(commands)
    try:
        codes = run_on_gpus(commands, gpus, poll_interval)
    except LaunchInterrupted as err:
        report_interrupted("multi_gpu", commands, err)
        raise
    report_exit_codes("multi_gpu", commands, codes, logs)


# --------------------------------------------------------------------------------------------
# Registration


def _register(name: str, fn: Callable) -> None:
    """Register, replacing an entry only when it comes from this module (a reload)."""
    if name in LAUNCHERS and getattr(LAUNCHERS.get(name), "__module__", None) == __name__:
        LAUNCHERS.unregister(name)
    LAUNCHERS.register(name, fn)


for _name, _fn in (("dummy", dummy_launcher), ("local", local_launcher),
                   ("multi_gpu", multi_gpu_launcher), ("submitit", submitit_launcher)):
    _register(_name, _fn)
