"""How a job's process starts: ``exec``'ed by the shell, or (this interpreter's train) forked from a
fork server that imported torch once; either way SIGTERM when its launcher dies (docs/sweep.md)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shlex
import signal
import subprocess
import sys
from typing import Sequence

from dg_plugins.signals import STOP_SIGNALS
from dg_plugins.train import cli as train_cli
from dg_plugins.job.flags import TRAIN_MODULE, parse_command


#: Words that ``exec`` cannot run (shell reserved words and builtins without a program).
_SHELL_WORDS = frozenset(
    "! { } case do done elif else esac fi for if in then until while . : alias break cd "
    "command continue eval exec exit export hash local read readonly return set shift source "
    "times trap type ulimit umask unalias unset wait".split())


def is_simple_command(command: str) -> bool:
    """Whether ``command`` is a program and plain words (its own ``shlex`` round trip)."""
    words = parse_command(command)[0]
    return (bool(words) and "=" not in words[0] and words[0] not in _SHELL_WORDS
            and shlex.join(words) == command)


#: ``0`` makes every job start a fresh interpreter instead (see :func:`forkable_train_args`).
FORK_ENV = "DG_PLUGINS_FORK_JOBS"
#: What the fork server imports once: a train job's imports (no CUDA context), then this module
#: (the job body it forks, even if the package on disk changes during the sweep).
PRELOAD = ("dg_plugins.train.preload", __name__)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_fork_context = _libc = None


def _load_libc():
    """libc, loaded before any fork (a child must not load libraries between fork and exec)."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = False
    return _libc or None


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Linux: ask the kernel for ``signum`` when the parent dies (False where unavailable)."""
    libc = _load_libc()
    return libc is not None and libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def _exit_if_orphaned(parent_pid: int) -> None:
    """Before ``exec``: end at once (143, as SIGTERM) when the launcher has already died."""
    if os.getppid() != parent_pid:
        os._exit(128 + signal.SIGTERM)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def main_module_is_reimport_safe() -> bool:
    """Whether a forked job may start from this ``__main__`` (not an unguarded script)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return (name == "__main__" or name.endswith(".__main__")
                or name.split(".")[0] == "dg_plugins")
    return getattr(main, "__file__", None) is None


def forkable_train_args(command: str) -> list[str] | None:
    """The ARGS of ``<this interpreter> -m dg_plugins.scripts.train ARGS`` when it may fork."""
    if (os.environ.get(FORK_ENV, "1") == "0" or not hasattr(os, "fork")
            or not main_module_is_reimport_safe() or not is_simple_command(command)):
        return None
    words = parse_command(command)[0]
    return words[3:] if words[:3] == [sys.executable, "-m", TRAIN_MODULE] else None


def _release_fork_server() -> None:
    """In a forked job: close its copy of the fork server's "alive" pipe."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None
    if hasattr(server, "_forkserver_address"):
        server._forkserver_address = None


def _train_in_child(args: list[str], environ: dict, cwd: str, new_session: bool,
                    ignored: tuple[int, ...], launcher_pid: int | None = None,
                    log: str | None = None) -> None:
    """A forked job: the launcher's environment, a fresh interpreter's signals, train's main."""
    server_pid = os.getppid()
    if log is not None:  # stdout and stderr (file descriptors 1 and 2) to the file
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        for target in (1, 2):
            os.dup2(fd, target)
        os.close(fd)
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN if int(signum) in ignored else
                      signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    # A forkserver child inherits the fork server's start method ("forkserver"); a fresh
    # interpreter has the platform's default. Without this reset, the job's own children (loader
    # workers) would be started by the launcher's fork server, not by the job.
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)
    _release_fork_server()
    die_with_parent()
    if os.getppid() != server_pid or (launcher_pid is not None and not _pid_alive(launcher_pid)):
        sys.exit(128 + signal.SIGTERM)  # the launcher died while this job was being forked
    sys.argv = [TRAIN_MODULE, *args]
    sys.exit(train_cli.main(args))


class ForkedJob:
    """A train job started by the fork server, with the part of ``Popen`` the launchers use."""

    def __init__(self, process):
        self.process = process
        self.pid = process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self.process.is_alive():
            self.process.join()
            self.returncode = self.process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired([TRAIN_MODULE], timeout)
        return self.returncode


def fork_train(args: Sequence[str], new_session: bool, log: str | None = None,
               env: dict | None = None) -> ForkedJob:
    """Start ``python -m dg_plugins.scripts.train ARGS`` from the fork server, with ``env``."""
    global _fork_context
    import multiprocessing

    if _fork_context is None:
        _fork_context = multiprocessing.get_context("forkserver")
        _fork_context.set_forkserver_preload(list(PRELOAD))
    ignored = tuple(int(s) for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    environ = dict(os.environ if env is None else env)
    process = _fork_context.Process(target=_train_in_child, name="train",
                                    args=(list(args), environ, os.getcwd(), new_session, ignored,
                                          os.getpid(), log))
    process.start()
    return ForkedJob(process)
