"""What one Slurm array task runs: its train jobs with ``--resume``, Slurm's signals passed on, and
a requeue at each time limit (submitit's checkpoint protocol; docs/sweep.md, "Slurm")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Sequence

from dg_plugins.job.folder import CHECKPOINT_FILE, DONE_FILE, is_done
from dg_plugins.runtime import CORES_ENV, job_cores
from dg_plugins.signals import SLURM_TASK_ENV as TASK_ENV
from dg_plugins.sweep.fork import _load_libc, die_with_parent
from dg_plugins.sweep.processes import command_output_dir

#: Allocations in a row that may end at a time limit before any job wrote a checkpoint.
MAX_STALLS = 2
#: Signals the task catches and passes on to its jobs as SIGTERM (USR2 is submitit's).
PASSED_ON = (signal.SIGTERM, signal.SIGINT)


def _child_setup() -> None:  # in the job's process, between fork and exec
    die_with_parent(signal.SIGKILL)  # never outlive the task (it waits for its jobs)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the time-limit signal is the task's


class TrainTask:
    """One array task: ``argvs`` (train commands, ``--resume`` added) run at once in ``cwd``."""

    def __init__(self, argvs: Sequence[Sequence[str]], cwd: str, grace_s: float,
                 stalls: int = 0):
        self.argvs = [list(a) + ([] if "--resume" in a else ["--resume"]) for a in argvs]
        self.cwd = cwd
        self.grace_s = grace_s
        self.stalls = stalls  # allocations in a row that ended before a new checkpoint
        self._procs: list[subprocess.Popen] = []
        self._signum: int | None = None
        self._started = 0.0

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _procs=[], _signum=None, _started=0.0)

    @property
    def folders(self) -> list[str]:
        return [command_output_dir(a) or "" for a in self.argvs]

    def __call__(self) -> str:
        self._started = time.time()
        for signum in PASSED_ON:
            signal.signal(signum, self._on_stop_signal)
        todo = [a for a in self.argvs if not is_done(command_output_dir(a) or "")]
        cores, _ = job_cores()
        env = dict(os.environ, **{TASK_ENV: "1",
                                  CORES_ENV: str(max(1, cores // max(1, len(todo))))})
        _load_libc()
        for argv in todo:
            if self._signum is not None:
                break
            print(f"dg_plugins task: starting {' '.join(argv)}", flush=True)
            self._procs.append(subprocess.Popen(argv, cwd=self.cwd, env=env,
                                                preexec_fn=_child_setup))
        codes = self._wait()
        if self._signum is not None:  # preempted or cancelled: the jobs stopped at a checkpoint
            print(f"dg_plugins task: stopped by {signal.Signals(self._signum).name}; the jobs "
                  "wrote their checkpoints (a requeued task resumes them)", flush=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + self._signum)  # no result: Slurm requeues or ends the job itself
        failed = [(f, c) for f, c in zip([command_output_dir(a) for a in todo], codes) if c != 0]
        if failed:
            raise RuntimeError("; ".join(f"train exited with code {c}: {f} (see its err.txt)"
                                         for f, c in failed))
        return f"{len(todo)} job(s) done"

    def _on_stop_signal(self, signum: int, frame=None) -> None:
        if self._signum is None:
            self._signum = signum
            self._pass_on()

    def _pass_on(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def _wait(self, deadline: float | None = None) -> list[int]:
        """Wait for the jobs (until ``deadline``, then SIGKILL); their exit codes."""
        while any(p.poll() is None for p in self._procs):
            if deadline is not None and time.monotonic() >= deadline:
                for proc in self._procs:
                    if proc.poll() is None:
                        print(f"dg_plugins task: {command_output_dir(proc.args)} did not stop "
                              f"within {self.grace_s:g} s; killed", flush=True)
                        proc.kill()
                deadline = None
            time.sleep(0.2)
        return [p.returncode for p in self._procs]

    def progressed(self) -> bool:
        """Whether a job wrote a checkpoint or finished during this allocation."""
        for folder in self.folders:
            for name in (CHECKPOINT_FILE, DONE_FILE):
                with contextlib.suppress(OSError):
                    if os.path.getmtime(os.path.join(folder, name)) >= self._started:
                        return True
        return False

    def checkpoint(self, *args, **kwargs):
        """submitit's time-limit hook: stop the jobs at a checkpoint; the task to requeue."""
        self._signum = self._signum or signal.SIGUSR2
        self._pass_on()
        self._wait(time.monotonic() + self.grace_s)
        stalls = 0 if self.progressed() else self.stalls + 1
        if stalls >= MAX_STALLS:
            print(f"dg_plugins task: {stalls} allocations in a row reached their time limit "
                  "before any job wrote a checkpoint: the allocation is too short for a job's "
                  "start-up and first step. Not requeued: raise --slurm_time (or lower "
                  "--slurm_signal_delay), then relaunch with --resume.", flush=True)
            return None
        from submitit.helpers import DelayedSubmission

        print("dg_plugins task: time limit: the jobs stopped at a checkpoint; requeued",
              flush=True)
        return DelayedSubmission(TrainTask(self.argvs, self.cwd, self.grace_s, stalls))
