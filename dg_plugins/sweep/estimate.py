"""What the jobs a launch would start cost, printed before ``Are you sure? (y/n)`` and in a
``--dry_run`` (docs/sweep.md), counted and timed in a child process
(:mod:`dg_plugins.sweep.estimate_child`) with a time limit: this process stays torch-free, and an
estimate that fails or runs out of time says so and stops nothing."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from dg_plugins.sweep.jobs import SweepJob

CHILD_MODULE = "dg_plugins.sweep.estimate_child"
#: The whole estimate's limit in seconds (the child's imports, the counting, the timed steps:
#: a third of it), ``$DG_SWEEP_ESTIMATE_TIMEOUT`` when set; 0 leaves the estimate out. Jobs of a
#: remote launcher are not timed here.
TIMEOUT_ENV, DEFAULT_TIMEOUT_S = "DG_SWEEP_ESTIMATE_TIMEOUT", 180.0
REMOTE_LAUNCHERS = {"submitit": "the submitit launcher runs the jobs on the cluster's nodes"}


def timeout_s() -> float:
    """The estimate's time limit (:data:`TIMEOUT_ENV`; a value that is no number: the
    default)."""
    try:
        return max(0.0, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def print_estimate(jobs: Sequence[SweepJob], launcher: str | None = None,
                   out: Callable[[str], None] | None = None) -> bool:
    """Print the cost lines of ``jobs`` as the child writes them; True when it finished, False
    (after a line saying why) when it failed or ran past :func:`timeout_s` (0: nothing done)."""
    out = out or (lambda line: print(line, flush=True))
    limit = timeout_s()
    if not jobs or not limit:
        return True
    data = json.dumps({  # the child's input (dg_plugins.sweep.estimate_child.main)
        "jobs": [{"train_args": job.train_args, "command_args": job.command_args}
                 for job in jobs],
        "budget_s": limit / 3, "remote": REMOTE_LAUNCHERS.get(launcher or "")}).encode()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=dict(os.environ))
        lines: queue.Queue = queue.Queue()

        def read() -> None:
            for raw in proc.stdout:
                lines.put(raw.decode(errors="replace").rstrip("\n"))
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except OSError:  # the child died at once: its error is read below
            pass
        deadline = time.monotonic() + limit
        finished = False
        try:
            while True:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if line is None:
                    finished = True
                    break
                out(line)
        finally:
            if not finished:
                proc.kill()
            proc.wait()
            reader.join(timeout=5)
        if not finished:
            out(f"(the cost estimate stopped after {limit:g} s, ${TIMEOUT_ENV}: what it had not "
                "printed by then is left out)")
            return False
        if proc.returncode:
            err.seek(0)
            tail = [ln.strip() for ln in err.read().decode(errors="replace").splitlines()
                    if ln.strip()]
            out(f"(the cost estimate failed, exit status {proc.returncode}: "
                f"{tail[-1] if tail else 'no message'}; the launch does not depend on it)")
            return False
    return True
