"""Command launchers (``domainbed/command_launchers.py``): ``fn(commands: list[str])`` with options
the sweep binds; importing this module registers dummy, local, multi_gpu and submitit. Several jobs
per GPU (``--jobs_per_gpu``): each job's share of the cores, and the check that its peak memory fits
a GPU's free memory before it starts (docs/sweep.md)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from dg_plugins.job.folder import RESULTS_FILE
from dg_plugins.registry import LAUNCHERS
from dg_plugins.runtime import CORES_ENV, job_cores
from dg_plugins.sweep.jobs import by_sweep, sweep_dir_of
from dg_plugins.sweep.progress import JobOutputs
from dg_plugins.sweep.processes import (ErrorLogs, JobProcesses, LaunchInterrupted,
                                        report_exit_codes, report_interrupted)
from dg_plugins.sweep.submitit import launch_problem as submitit_problem
from dg_plugins.sweep.submitit import submitit_launcher


#: What a job needs beyond its records' ``mem_gb`` (``torch.cuda.max_memory_allocated``): the
#: caching allocator's slack, as a factor, and the CUDA context, in GiB.
ALLOCATOR_SLACK, CONTEXT_GB = 1.2, 1.0


class PackingRefused(SystemExit):
    """N jobs per GPU do not fit: a ``SystemExit`` with status 2 and the line that says so."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


def cores_per_job(n_gpus: int, jobs_per_gpu: int) -> tuple[int, str]:
    """The cores each of ``n_gpus x jobs_per_gpu`` jobs at once gets, and the line that says so."""
    cores, source = job_cores()
    share = max(1, cores // (n_gpus * jobs_per_gpu))
    return share, (f"multi_gpu: {n_gpus} GPU(s) x {jobs_per_gpu} job(s) at once; each job gets "
                   f"{share} of the launcher's {cores} cores ({source}): {CORES_ENV}={share}")


def job_env(gpu: str, cores: int) -> dict:
    return dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, **{CORES_ENV: str(cores)})


def peak_gb(folders: Sequence[str | None]) -> tuple[float, str] | None:
    """The largest ``mem_gb`` in the records of the job ``folders``, and its folder (or None)."""
    peaks = []
    for folder in filter(None, folders):
        try:
            with open(os.path.join(folder, RESULTS_FILE)) as handle:
                values = [json.loads(line).get("mem_gb") for line in handle if line.strip()]
        except (OSError, ValueError):
            continue
        peaks += [(float(value), folder) for value in values if isinstance(value, (int, float))]
    return max(peaks, key=lambda peak: peak[0], default=None)


def free_gb(gpu: str) -> float | None:
    """GPU ``gpu``'s free memory in GiB by nvidia-smi, else torch in a child process (or None)."""
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,"
                               "nounits", "-i", gpu], capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return float(done.stdout.split()[0]) / 1024  # MiB
    code = ("import torch, sys; print(torch.cuda.mem_get_info(0)[0] / 2**30 "
            "if torch.cuda.is_available() else '')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu))
    with contextlib.suppress(ValueError):
        return float(done.stdout.strip())
    return None


@dataclass
class MemoryCheck:
    """Whether ``jobs_per_gpu`` jobs fit on each GPU, decided once a peak is known and again with
    each sweep's larger peak in a queue of several sweeps (e.g. a ResNet-18 and a ResNet-50)."""

    gpus: Sequence[str]
    jobs_per_gpu: int
    free: dict | None = None
    decided: bool = False
    #: sweep folder -> its jobs' peak (GiB, job folder), for those checked
    peaks: dict = field(default_factory=dict)

    def knows(self, job_folder: str | None) -> bool:
        """Whether the sweep of ``job_folder`` has a checked peak (else its first runs alone)."""
        return job_folder is None or sweep_dir_of(job_folder) in self.peaks

    def update(self, job_folders: Sequence[str | None]) -> str | None:
        """Check the sweeps of ``job_folders`` whose peak is known now (the largest decides)."""
        groups = by_sweep(filter(None, job_folders))
        notes = []
        for sweep, folders in groups.items():
            if sweep in self.peaks or (peak := peak_gb(folders)) is None:
                continue
            largest = max(self.peaks.values(), default=None)
            self.peaks[sweep] = peak
            if largest is None or peak[0] > largest[0]:
                self.decided = False
                notes.append(self.decide(peak))
        self.decided = bool(self.peaks) and all(sweep in self.peaks for sweep in groups)
        return "\n".join(note for note in notes if note) or None

    def decide(self, peak: tuple[float, str] | None) -> str | None:
        """The line that says the jobs fit (None: no peak yet); :class:`PackingRefused` if not."""
        if self.decided or peak is None:
            return None
        self.decided = True
        if self.free is None:
            self.free = {gpu: free_gb(gpu) for gpu in self.gpus}
        known = {gpu: gb for gpu, gb in self.free.items() if gb is not None}
        need = peak[0] * ALLOCATOR_SLACK + CONTEXT_GB
        where = f"{peak[0]:.2f} GiB at its peak ({peak[1]}'s records)"
        if not known:
            return (f"multi_gpu: the GPUs' free memory cannot be read (no nvidia-smi, no CUDA in "
                    f"torch): {self.jobs_per_gpu} jobs per GPU without the memory check; a job "
                    f"needs about {need:.1f} GiB ({where})")
        gpu, free = min(known.items(), key=lambda item: item[1])
        fit = int(free // need)
        if fit < self.jobs_per_gpu:
            raise PackingRefused(
                f"--jobs_per_gpu {self.jobs_per_gpu}: a job needs about {need:.1f} GiB ({where}, "
                f"x{ALLOCATOR_SLACK} for the allocator + {CONTEXT_GB:g} GiB of CUDA context) and "
                f"GPU {gpu} has {free:.1f} GiB free: {fit} fit; relaunch with --jobs_per_gpu "
                f"{max(1, fit)} (finished jobs are kept, interrupted ones resume)")
        return (f"multi_gpu: {self.jobs_per_gpu} jobs per GPU fit: a job needs about {need:.1f} "
                f"GiB ({where}), GPU {gpu} has {free:.1f} GiB free")


def dummy_launcher(commands: list[str]) -> None:
    for command in commands:
        print(f"Dummy launcher: {command}")


def run_sequentially(commands: Sequence[str], grace_period_s: float | None,
                     logs: ErrorLogs) -> list[int]:
    """Run each command, one after another; return the exit codes."""
    codes: list[int] = []
    with contextlib.ExitStack() as stack:
        bar = write = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            bar = stack.enter_context(tqdm(total=len(commands), desc="jobs", unit="job",
                                           file=sys.stderr))
            write = lambda line: bar.write(line, file=sys.stdout)  # noqa: E731  (above the bar)
        outputs = JobOutputs(commands, logs, **({"write": write} if write else {}))
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


def _run_and_report(name: str, commands: Sequence[str], run: Callable, **options) -> None:
    """Report ``run(commands, logs=..., **options)``'s exit codes (``JobsFailed``), or its stop."""
    logs = ErrorLogs(commands)
    try:
        codes = run(commands, logs=logs, **options)
    except LaunchInterrupted as err:
        report_interrupted(name, commands, err)
        raise
    report_exit_codes(name, commands, codes, logs)


def local_launcher(commands: list[str], grace_period_s: float | None = None) -> None:
    """Run the commands serially on this machine."""
    _run_and_report("local", commands, run_sequentially, grace_period_s=grace_period_s)


#: Why the multi_gpu launcher cannot run here, and the fix.
NO_GPU = ("no GPU visible (CUDA_VISIBLE_DEVICES is empty or torch.cuda.device_count() is 0); use "
          "the local launcher on CPU machines")


def visible_gpus() -> list[str]:
    """GPU ids from ``CUDA_VISIBLE_DEVICES`` when set, else from torch's device count."""
    if (env := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
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
    cores, line = cores_per_job(len(gpus), jobs_per_gpu)
    print(line, flush=True)
    check = MemoryCheck(gpus, jobs_per_gpu) if jobs_per_gpu > 1 else None
    refused = None

    def decide(folders) -> None:  # each sweep's peak (a queue of several sweeps)
        note = check.update(folders) if check is not None and refused is None else None
        if note:
            print(note, flush=True)

    decide(logs.folders)  # records of a resumed sweep (PackingRefused: before any job starts)
    slots = [(gpu, k) for k in range(jobs_per_gpu) for gpu in gpus]
    codes: list[int | None] = [None] * len(commands)
    running: dict[tuple, tuple[int, subprocess.Popen]] = {}
    pending = list(enumerate(commands))
    outputs = JobOutputs(commands, logs, parallel=len(slots))
    with JobProcesses(grace_period_s) as jobs, outputs:
        while (pending and not jobs.stopping and refused is None) or running:
            for slot, (index, proc) in list(running.items()):
                if (code := jobs.poll(proc)) is not None:
                    codes[index] = code
                    del running[slot]
                    outputs.ended(index, code, interrupted=jobs.stopping)
            try:  # refused: no further job starts, raised once the running jobs ended
                decide([logs.folders[i] for i, _ in running.values()]
                       + [logs.folders[i] for i, code in enumerate(codes) if code is not None])
            except PackingRefused as err:
                refused = err
            packed = check is None or check.decided
            for slot in slots:
                if not pending or jobs.stopping or refused is not None:
                    break
                if slot in running or (slot[1] > 0 and not packed):
                    continue
                index, command = pending.pop(0)
                proc = jobs.start(index, command, env=job_env(slot[0], cores),
                                  log=outputs.log(index))
                if proc is None:  # stopping: interruption() counts it as not started
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
        _run_and_report("multi_gpu", commands, run_on_gpus, gpus=gpus, poll_interval=poll_interval,
                        grace_period_s=grace_period_s, jobs_per_gpu=jobs_per_gpu or 1)
    except PackingRefused as err:
        print(f"error: {err}", file=sys.stderr)
        raise


def launch_problem(name: str, submitit=None) -> str | None:
    """Why the built-in launcher ``name`` cannot launch from here, with the fix (None: it can)."""
    if name == "multi_gpu":
        return None if visible_gpus() else NO_GPU
    return submitit_problem(submitit) if name == "submitit" else None


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
