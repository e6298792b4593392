"""The Slurm task's pieces that need no cluster: its time-limit hook (jobs stopped, requeued
while they progress, not requeued after two allocations without a checkpoint), its pickled
state, and how Slurm's times and GPUs are read (the lifecycle on a real Slurm: tests/slurm/)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest

from dg_plugins.sweep import submitit as slurm
from dg_plugins.sweep.submitit import MAX_STALLS, TrainTask

SLEEPER = "import time; time.sleep(120)"


def started_task(folder, stalls=0) -> TrainTask:
    """A task whose one job (a sleeping process that dies on SIGTERM) is running."""
    task = TrainTask([[sys.executable, "-c", SLEEPER, "--output_dir", str(folder)]],
                     str(folder), grace_s=10, stalls=stalls)
    task._started = time.time() - 1.0  # a file's time may lag time.time() by a clock tick
    task._procs.append(subprocess.Popen(task.argvs[0]))
    return task


def test_the_time_limit_hook_stops_the_jobs_and_requeues_while_they_progress(tmp_path):
    pytest.importorskip("submitit")
    task = started_task(tmp_path, stalls=1)
    (tmp_path / "checkpoint.pt").write_bytes(b"written in this allocation")
    delayed = task.checkpoint()
    assert task._procs[0].returncode is not None  # stopped
    assert delayed is not None and delayed.function.stalls == 0
    assert delayed.function.argvs[0][-1] == "--resume"


def test_two_allocations_without_a_checkpoint_are_not_requeued(tmp_path, capsys):
    pytest.importorskip("submitit")
    old = tmp_path / "checkpoint.pt"
    old.write_bytes(b"from an earlier allocation")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    first = started_task(tmp_path).checkpoint()
    assert first is not None and first.function.stalls == 1
    second = started_task(tmp_path, stalls=first.function.stalls).checkpoint()
    assert second is None and MAX_STALLS == 2
    assert "before any job wrote a checkpoint" in capsys.readouterr().out


def test_a_task_pickles_without_its_processes(tmp_path):
    task = started_task(tmp_path)
    try:
        copy = pickle.loads(pickle.dumps(task))
    finally:
        task._procs[0].kill()
        task._procs[0].wait()
    assert copy.argvs == task.argvs and copy._procs == [] and copy.stalls == 0


@pytest.mark.parametrize("text, minutes", [("UNLIMITED", None), ("infinite", None),
                                           ("00:02:00", 2), ("2:00", 2), ("30", 30),
                                           ("1-00:00:00", 1440), ("1-02:30:00", 1590)])
def test_slurm_times(text, minutes):
    assert slurm.minutes(text) == minutes


@pytest.mark.parametrize("gres, gpus", [("(null)", 0), ("gpu:4", 4), ("gpu:a100:8(S:0-1)", 8),
                                        ("gpu:a100:2,gpu:v100:2", 4), ("mps:100", 0)])
def test_gpus_in_a_nodes_gres(gres, gpus):
    assert slurm.gpus_in(gres) == gpus
