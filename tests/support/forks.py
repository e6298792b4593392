"""Functions run in a child forked from the test's process (a job's process: torch and dg_plugins
imported already, so no interpreter start-up and no imports to pay): :func:`forked` starts one,
:func:`forked_result` waits for it (never a hang: a time limit, :func:`within`, then the child
is killed)."""

from __future__ import annotations

import contextlib
import os
import signal
import traceback


@contextlib.contextmanager
def within(seconds: int, on_hang=None):
    """Fail with a hang instead of waiting forever (SIGALRM in this process); ``on_hang()``
    first, if given."""
    def hung(signum, frame):
        if on_hang is not None:
            on_hang()
        raise AssertionError(f"no result within {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def forked(function, *args) -> tuple[int, int]:
    """``function(*args)`` in a forked child: (its pid, the read end of a pipe that gets the
    text of its result, or its traceback). The child exits 0, or 1 on an exception, without
    returning into the caller (``os._exit``)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status, text = 1, ""
        try:
            os.close(read)
            text, status = str(function(*args)), 0
        except BaseException:
            text = traceback.format_exc()
        finally:
            try:
                os.write(write, text.encode())
            finally:
                os._exit(status)
    os.close(write)
    return pid, read


def forked_result(pid: int, read: int, timeout: int = 120) -> tuple[int, str]:
    """(exit status, as subprocess gives it: -N for a signal; text) of a :func:`forked` child,
    once it has ended; past ``timeout`` seconds it is killed and the test fails (a hang)."""
    with within(timeout, lambda: os.kill(pid, signal.SIGKILL)):
        with os.fdopen(read, "rb") as pipe:
            text = pipe.read().decode()
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text
