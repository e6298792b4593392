"""Run the package's commands as a user does (a subprocess, under a timeout so a hang fails the
test) and find every process a command left behind.

Each command gets a unique ``DG_TEST_RUN`` environment variable; every process it starts inherits
it (loader workers under any start method), so :func:`survivors` finds them after the command
exited, even when they were re-parented.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "DG_TEST_RUN"


def python_path(*folders) -> str:
    """A PYTHONPATH of ``folders`` then this process's own (packages a machine installs outside
    site-packages, e.g. with ``pip --target``, stay visible to a test's subprocesses)."""
    return os.pathsep.join([*map(str, folders), *filter(None, [os.environ.get("PYTHONPATH")])])


def command_env(**extra) -> dict:
    env = dict(os.environ)
    env[MARKER] = uuid.uuid4().hex
    env["PYTHONPATH"] = python_path(REPO / "tests")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def module_command(module: str, *args) -> list[str]:
    return [sys.executable, "-m", module, *map(str, args)]


def as_from_a_terminal() -> None:
    """``preexec_fn`` of the processes a test signals: the stop signals' default dispositions, as
    a program started from a terminal has them. A pytest run in the background (``pytest &`` in
    a script) inherits SIGINT ignored, one under ``nohup`` SIGHUP, and its children with them;
    a sweep rightly stays immune to a signal it inherited as ignored."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def start(module: str, *args, env: dict) -> subprocess.Popen:
    """Start ``python -m module args`` in its own session (as a sweep starts a job), with the
    stop signals' default dispositions (:func:`as_from_a_terminal`)."""
    return subprocess.Popen(
        module_command(module, *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=as_from_a_terminal)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for ``proc``; on timeout kill its whole process group and fail (a hang)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{proc.args[2]} did not exit within {timeout} s (a hang); its "
                             f"output:\n{out.decode(errors='replace')[-4000:]}") from None
    return proc.returncode, out.decode(errors="replace")


def run(module: str, *args, env: dict, timeout: float) -> tuple[int, str]:
    return finish(start(module, *args, env=env), timeout)


def _marked(env: dict) -> list[str]:
    """``"pid: command"`` of every live (not zombie) process that inherited ``env``'s marker."""
    needle = f"{MARKER}={env[MARKER]}".encode()
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            alive.append(f"{pid}: {cmd}")
    return alive


def _signal_all(lines: list[str], signum: int) -> None:
    for line in lines:
        try:
            os.kill(int(line.split(":")[0]), signum)
        except OSError:
            pass


def survivors(env: dict, wait: float = 10.0) -> list[str]:
    """Processes still alive that inherited ``env``'s marker, after up to ``wait`` seconds
    (a worker may need a moment to notice its parent is gone)."""
    deadline = time.monotonic() + wait
    while True:
        alive = _marked(env)
        if not alive or time.monotonic() > deadline:
            _signal_all(alive, signal.SIGKILL)  # do not let a failing test leave them running
            return alive
        time.sleep(0.2)


def stop_marked(env: dict) -> list[str]:
    """Stop a hung command's processes (``env``'s marker): SIGABRT first, on which a Python
    process run with ``PYTHONFAULTHANDLER=1`` prints every thread's stack to its stderr, then
    SIGKILL to any left after 3 s. Returns the processes found."""
    found = _marked(env)
    _signal_all(found, signal.SIGABRT)
    survivors(env, wait=3.0)
    return found
