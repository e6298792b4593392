"""What the jobs a launch would start cost, printed before ``Are you sure? (y/n)`` and in a dry run:
counted in a child process (this one stays torch-free) with a time limit; an estimate that fails
or runs out of time says so and stops nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from dg_plugins.sweep.jobs import SweepJob

#: The child process: ``python -m CHILD_MODULE`` (:func:`dg_plugins.sweep.costs.main`).
CHILD_MODULE = "dg_plugins.sweep.costs"
#: The whole estimate's limit in seconds (the timed steps: a third of it); 0 leaves it out.
TIMEOUT_ENV, DEFAULT_TIMEOUT_S = "DG_SWEEP_ESTIMATE_TIMEOUT", 180.0
REMOTE_LAUNCHERS = {"submitit": "the submitit launcher runs the jobs on the cluster's nodes"}


def print_estimate(jobs: Sequence[SweepJob], launcher: str | None = None,
                   out: Callable[[str], None] | None = None) -> bool:
    """Print the cost lines of ``jobs`` as the child writes them (False: it failed or timed out)."""
    out = out or (lambda line: print(line, flush=True))
    try:
        limit = max(0.0, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    except ValueError:
        limit = DEFAULT_TIMEOUT_S
    if not jobs or not limit:
        return True
    data = json.dumps({  # the child's input (costs.main)
        "jobs": [{"train_args": job.train_args, "command_args": job.command_args}
                 for job in jobs],
        "budget_s": limit / 3, "remote": REMOTE_LAUNCHERS.get(launcher or "")}).encode()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=dict(os.environ))
        deadline = time.monotonic() + limit
        timer = threading.Timer(limit, proc.kill)  # the time limit ends the lines below
        timer.start()
        finished = False
        try:
            with contextlib.suppress(OSError):  # the child died at once: its error is read below
                proc.stdin.write(data)
                proc.stdin.close()
            for raw in proc.stdout:
                out(raw.decode(errors="replace").rstrip("\n"))
            finished = proc.wait() != -signal.SIGKILL or time.monotonic() < deadline
        finally:
            timer.cancel()
            if not finished:
                proc.kill()
            proc.wait()
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
