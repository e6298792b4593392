"""Command launchers (``domainbed/command_launchers.py``): ``fn(commands: list[str])`` with options
the sweep binds; importing this module registers dummy, local, multi_gpu and submitit."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import subprocess
import sys
import time
from typing import Callable, Sequence

from dg_plugins.registry import LAUNCHERS
from dg_plugins.sweep import packing
from dg_plugins.sweep.job_reports import JobOutputs
from dg_plugins.sweep.processes import (ErrorLogs, JobProcesses, LaunchInterrupted,
                                        report_exit_codes, report_interrupted)
from dg_plugins.sweep.submitit import launch_problem as submitit_problem
from dg_plugins.sweep.submitit import submitit_launcher


def dummy_launcher(commands: list[str]) -> None:
    """Print ``Dummy launcher: <cmd>`` for each command; run nothing."""
    for command in commands:
        print(f"Dummy launcher: {command}")


def run_sequentially(commands: Sequence[str], progress: bool | None = None,
                     grace_period_s: float | None = None,
                     logs: ErrorLogs | None = None) -> list[int]:
    """Run each command, one after another; return the exit codes."""
    codes: list[int] = []
    with contextlib.ExitStack() as stack:
        bar = write = None
        if sys.stderr.isatty() if progress is None else progress:
            from tqdm import tqdm

            bar = stack.enter_context(tqdm(total=len(commands), desc="jobs", unit="job",
                                           file=sys.stderr))
            write = lambda line: bar.write(line, file=sys.stdout)  # noqa: E731  (above the bar)
        outputs = JobOutputs("local", commands, logs or ErrorLogs(commands),
                             **({"write": write} if write else {}))
        jobs = stack.enter_context(JobProcesses(grace_period_s))
        stack.enter_context(outputs)
        for i, command in enumerate(commands):
            if jobs.stopping or (proc := jobs.start(i, command, log=outputs.log(i))) is None:
                break
            outputs.started(i)
            codes.append(jobs.wait(proc))
            outputs.ended(i, codes[-1], interrupted=jobs.stopping)
            if bar is not None:
                bar.update()
        if jobs.stopping:
            raise jobs.interruption(commands, codes)
    return codes


def _run_and_report(name: str, commands: Sequence[str], run: Callable) -> None:
    """Report ``run(logs)``'s exit codes (``JobsFailed`` when a job failed), or its stop."""
    logs = ErrorLogs(commands)
    try:
        codes = run(logs)
    except LaunchInterrupted as err:
        report_interrupted(name, commands, err)
        raise
    report_exit_codes(name, commands, codes, logs)


def local_launcher(commands: list[str], grace_period_s: float | None = None) -> None:
    """Run the commands serially on this machine."""
    _run_and_report("local", commands, lambda logs: run_sequentially(
        commands, grace_period_s=grace_period_s, logs=logs))


#: Why the multi_gpu launcher cannot run here, and the fix.
NO_GPU = ("no GPU visible (CUDA_VISIBLE_DEVICES is empty or torch.cuda.device_count() is 0); use "
          "the local launcher on CPU machines")


def visible_gpus() -> list[str]:
    """GPU ids from ``CUDA_VISIBLE_DEVICES`` when set, else from torch's device count."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [gpu.strip() for gpu in env.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_on_gpus(commands: Sequence[str], gpus: Sequence[str],
                poll_interval: float = 1.0, grace_period_s: float | None = None,
                logs: ErrorLogs | None = None, jobs_per_gpu: int = 1) -> list[int]:
    """Run the commands, ``jobs_per_gpu`` at a time on each GPU; return the exit codes."""
    gpus = list(gpus)
    if not gpus:
        raise RuntimeError(f"multi_gpu launcher: {NO_GPU}")
    logs = logs or ErrorLogs(commands)
    cores, line = packing.cores_per_job(len(gpus), jobs_per_gpu)
    print(line, flush=True)
    check = packing.MemoryCheck(gpus, jobs_per_gpu) if jobs_per_gpu > 1 else None
    refused = None

    def decide(folders) -> None:  # each sweep's peak (a queue of several sweeps)
        nonlocal refused
        try:
            note = check.update(folders) if check is not None and refused is None else None
        except packing.PackingRefused as err:
            refused, note = err, None
        if note:
            print(note, flush=True)

    decide(logs.folders)  # records of a resumed sweep
    if refused is not None:
        raise refused
    slots = [(gpu, k) for k in range(jobs_per_gpu) for gpu in gpus]
    codes: list[int | None] = [None] * len(commands)
    running: dict[tuple, tuple[int, subprocess.Popen]] = {}
    pending = list(enumerate(commands))
    outputs = JobOutputs("multi_gpu", commands, logs, parallel=len(slots))
    with JobProcesses(grace_period_s) as jobs, outputs:
        while (pending and not jobs.stopping and refused is None) or running:
            for slot, (index, proc) in list(running.items()):
                code = jobs.poll(proc)
                if code is not None:
                    codes[index] = code
                    del running[slot]
                    outputs.ended(index, code, interrupted=jobs.stopping)
            decide([logs.folders[i] for i, _ in running.values()]
                   + [logs.folders[i] for i, code in enumerate(codes) if code is not None])
            packed = check is None or check.decided
            for slot in slots:
                if not pending or jobs.stopping or refused is not None:
                    break
                if slot in running or (slot[1] > 0 and not packed):
                    continue
                index, command = pending.pop(0)
                proc = jobs.start(index, command, env=packing.job_env(slot[0], cores),
                                  log=outputs.log(index))
                if proc is None:
                    pending.insert(0, (index, command))
                    break
                outputs.started(index, f"GPU {slot[0]}")
                running[slot] = (index, proc)
                packed = packed and (check is None or check.knows(logs.folders[index]))
            jobs.announce()
            if running:
                time.sleep(min(poll_interval, 0.1) if jobs.stopping else poll_interval)
        if jobs.stopping:
            raise jobs.interruption(commands, codes)
    if refused is not None:
        raise refused
    return [int(code) for code in codes]


def multi_gpu_launcher(commands: list[str], gpus: Sequence[str] | None = None,
                       poll_interval: float = 1.0, grace_period_s: float | None = None,
                       jobs_per_gpu: int | None = None) -> None:
    """``jobs_per_gpu`` jobs (default 1) at a time on each visible GPU (or ``gpus``)."""
    gpus = visible_gpus() if gpus is None else gpus
    try:
        _run_and_report("multi_gpu", commands, lambda logs: run_on_gpus(
            commands, gpus, poll_interval, grace_period_s, logs=logs,
            jobs_per_gpu=jobs_per_gpu or 1))
    except packing.PackingRefused as err:
        print(f"error: {err}", file=sys.stderr)
        raise


def launch_problem(name: str, submitit=None) -> str | None:
    """Why the built-in launcher ``name`` cannot launch from here, with the fix (None: it can)."""
    if name == "multi_gpu":
        return None if visible_gpus() else NO_GPU
    if name == "submitit":
        return submitit_problem(submitit)
    return None


def with_options(launcher: Callable, **options) -> Callable[[list], None]:
    """``launcher`` with the options set that it takes as keyword parameters bound."""
    try:
        parameters = inspect.signature(launcher).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no keyword options
        return launcher
    given = {name: value for name, value in options.items()
             if name in parameters and value is not None}
    return functools.partial(launcher, **given) if given else launcher


for _name, _fn in (("dummy", dummy_launcher), ("local", local_launcher),
                   ("multi_gpu", multi_gpu_launcher), ("submitit", submitit_launcher)):
    if _name in LAUNCHERS and getattr(LAUNCHERS.get(_name), "__module__", None) == __name__:
        LAUNCHERS.unregister(_name)  # this module reloaded: replace only its own entries
    LAUNCHERS.register(_name, _fn)
