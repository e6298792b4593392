"""Several jobs per GPU (``--jobs_per_gpu``): each job's share of the cores, and the check that
its peak memory fits a GPU's free memory before it starts (docs/sweep.md). Torch-free."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Sequence

from dg_plugins.runtime import CORES_ENV, job_cores
from dg_plugins.job.folder import RESULTS_FILE
from dg_plugins.sweep.claims import sweep_dir_of

#: What a job needs beyond its records' ``mem_gb`` (``torch.cuda.max_memory_allocated``): the
#: caching allocator's slack, as a factor, and the CUDA context, in GiB.
ALLOCATOR_SLACK, CONTEXT_GB = 1.2, 1.0


class PackingRefused(SystemExit):
    """N jobs per GPU do not fit: a ``SystemExit`` with status 2 and the line that says so."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def cores_per_job(n_gpus: int, jobs_per_gpu: int) -> tuple[int, str]:
    """The cores each of ``n_gpus x jobs_per_gpu`` jobs at once gets, and the line that says so."""
    cores, source = job_cores()
    share = max(1, cores // (n_gpus * jobs_per_gpu))
    return share, (f"multi_gpu: {n_gpus} GPU(s) x {jobs_per_gpu} job(s) at once; each job gets "
                   f"{share} of the launcher's {cores} cores ({source}): {CORES_ENV}={share}")


def job_env(gpu: str, cores: int) -> dict:
    """The environment of a job on ``gpu`` with ``cores`` cores."""
    return dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, **{CORES_ENV: str(cores)})


def peak_gb(folders: Sequence[str | None]) -> tuple[float, str] | None:
    """The largest ``mem_gb`` in the records of the job ``folders``, and its folder (or None)."""
    best = None
    for folder in filter(None, folders):
        try:
            with open(os.path.join(folder, RESULTS_FILE)) as handle:
                values = [json.loads(line).get("mem_gb") for line in handle if line.strip()]
        except (OSError, ValueError):
            continue
        for value in values:
            if isinstance(value, (int, float)) and (best is None or value > best[0]):
                best = (float(value), folder)
    return best


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
    try:
        return float(done.stdout.strip())
    except ValueError:
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
        by_sweep: dict[str, list[str]] = {}
        for folder in job_folders:
            if folder:
                by_sweep.setdefault(sweep_dir_of(folder), []).append(folder)
        notes = []
        for sweep, folders in by_sweep.items():
            if sweep in self.peaks or (peak := peak_gb(folders)) is None:
                continue
            largest = max(self.peaks.values(), default=None)
            self.peaks[sweep] = peak
            if largest is None or peak[0] > largest[0]:
                self.decided = False
                notes.append(self.decide(peak))
        self.decided = bool(self.peaks) and all(sweep in self.peaks for sweep in by_sweep)
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
