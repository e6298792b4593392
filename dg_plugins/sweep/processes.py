"""Job processes of the local, multi-GPU and submitit-local launchers: how a job's process starts
(``exec``'ed by the shell, or, this interpreter's train, forked from a fork server that imported
torch once; either way SIGTERM when its launcher dies), process groups, stop signals forwarded,
the grace period, failure and interruption summaries (docs/sweep.md)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import time
from multiprocessing import forkserver
from typing import Sequence

from dg_plugins.job.flags import TRAIN_MODULE, parse_command
from dg_plugins.job.folder import ERR_FILE, is_done, lock_holder
from dg_plugins.runtime import pid_alive
from dg_plugins.signals import STOP_SIGNALS, SignalCatcher, signal_name, stop_grace_period
from dg_plugins.train import cli as train_cli


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
        _libc = False
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc or None


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Linux: ask the kernel for ``signum`` when the parent dies (False where unavailable)."""
    libc = _load_libc()
    return libc is not None and libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def _exit_if_orphaned(parent_pid: int) -> None:
    """Before ``exec``: end at once (143, as SIGTERM) when the launcher has already died."""
    if os.getppid() != parent_pid:
        os._exit(128 + signal.SIGTERM)


def main_module_is_reimport_safe() -> bool:
    """Whether a forked job may start from this ``__main__`` (not an unguarded script)."""
    main = sys.modules.get("__main__")
    if (name := getattr(getattr(main, "__spec__", None), "name", None)) is not None:
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


def _train_in_child(args: list[str], environ: dict, cwd: str, new_session: bool,
                    ignored: tuple[int, ...], launcher_pid: int, log: str | None) -> None:
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
    multiprocessing.set_start_method(None, force=True)
    server = getattr(forkserver, "_forkserver", None)  # its copy of the server's "alive" pipe
    if (fd := getattr(server, "_forkserver_alive_fd", None)) is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None
        server._forkserver_address = None
    die_with_parent()
    if os.getppid() != server_pid or not pid_alive(launcher_pid):
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
    if _fork_context is None:
        _fork_context = multiprocessing.get_context("forkserver")
        _fork_context.set_forkserver_preload(list(PRELOAD))
    ignored = tuple(int(s) for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    process = _fork_context.Process(target=_train_in_child, name="train",
                                    args=(list(args), dict(os.environ if env is None else env),
                                          os.getcwd(), new_session, ignored, os.getpid(), log))
    process.start()
    return ForkedJob(process)


class LaunchInterrupted(SystemExit):
    """A launcher stopped by a stop signal: a ``SystemExit`` of 128 + signal."""

    def __init__(self, signum: int, interrupted: Sequence[str], not_started: Sequence[str],
                 exit_codes: Sequence[int | None] = (), remote: bool = False,
                 notes: Sequence[str] = ()):
        super().__init__(128 + signum)
        self.signum = signum
        self.interrupted = list(interrupted)
        self.not_started = list(not_started)
        self.exit_codes = list(exit_codes)
        self.remote = remote
        self.notes = list(notes)

    def __str__(self) -> str:
        return (f"stopped by {signal_name(self.signum)}: {len(self.interrupted)} job(s) "
                f"interrupted, {len(self.not_started)} not started")


class JobsFailed(SystemExit):
    """Some jobs of a launcher that waited for them failed: a ``SystemExit`` of 1."""

    def __init__(self, failed: Sequence[str], n_commands: int,
                 exit_codes: Sequence[int | None] | None = None):
        super().__init__(1)
        self.failed = list(failed)
        self.n_commands = n_commands
        self.exit_codes = list(exit_codes) if exit_codes is not None else [None] * len(failed)

    def __str__(self) -> str:
        return f"{len(self.failed)} of {self.n_commands} jobs failed"


#: Error lines shown per failed job, and failed jobs shown in full, in a failure summary.
ERROR_LINES_SHOWN = 3
FAILED_JOBS_SHOWN = 10


def command_output_dir(command: str) -> str | None:
    """The ``--output_dir`` of a job command (what the sweep writes), or None."""
    return (parse_command(command)[1].get("output_dir") or [None])[0]


def read_lines(path: str | None, offset: int = 0) -> list[str]:
    """The non-blank lines of ``path`` from byte ``offset`` (or its start), right-stripped."""
    text = ""
    with contextlib.suppress(OSError, TypeError), open(path, "rb") as f:
        f.seek(offset if offset <= os.fstat(f.fileno()).st_size else 0)
        text = f.read().decode(errors="replace")
    return [line.rstrip() for line in text.splitlines() if line.strip()]


class ErrorLogs:
    """Where each job's ``err.txt`` ends before the launcher runs it (what this run added)."""

    def __init__(self, commands: Sequence[str]):
        self.folders = [command_output_dir(c) for c in commands]
        self.offsets = [0] * len(self.folders)
        for i, path in enumerate(map(self.path, range(len(self.folders)))):
            with contextlib.suppress(OSError, TypeError):
                self.offsets[i] = os.path.getsize(path)
        #: index -> a job's captured output (for a job that failed before it took its folder)
        self.captured: dict[int, list[str]] = {}

    def path(self, index: int) -> str | None:
        folder = self.folders[index]
        return os.path.join(folder, ERR_FILE) if folder else None

    def new_lines(self, index: int) -> list[str]:
        """The lines job ``index`` added to its err.txt, else what the launcher captured."""
        return read_lines(self.path(index), self.offsets[index]) or self.captured.get(index, [])


def error_excerpt(lines: Sequence[str], n: int = ERROR_LINES_SHOWN) -> list[str]:
    """The lines that say what went wrong: train's ``error:``/``stopped:`` lines, else the end."""
    marked = [line for line in lines if line.startswith(("error:", "stopped:"))]
    return marked[:n] if marked else list(lines[-n:])


def report_exit_codes(name: str, commands: Sequence[str], exit_codes: Sequence[int],
                      logs: ErrorLogs) -> list[int]:
    """Print the summary and each failed job's error lines; :class:`JobsFailed` when one failed."""
    failed, running = [], []
    for i, code in enumerate(exit_codes):
        if code == 0 or is_done(logs.folders[i]):
            continue
        holder = lock_holder(logs.folders[i]) if logs.folders[i] else None
        (running if holder is not None else failed).append((i, holder))
    for i, holder in running:
        print(f"{name} launcher: still running in another process (pid {holder}), not failed: "
              f"{logs.folders[i]}", flush=True)
    if not failed:
        print(f"{name} launcher: all {len(commands)} commands succeeded."
              if not running else
              f"{name} launcher: no command failed ({len(running)} left to the process that "
              "holds them).", flush=True)
        return []
    print(f"{name} launcher: {len(failed)} of {len(commands)} commands failed:", flush=True)
    for i, _ in failed[:FAILED_JOBS_SHOWN]:
        excerpt = [f"      {line}" for line in error_excerpt(logs.new_lines(i))]
        print("\n".join([f"  exit code {exit_codes[i]}: {commands[i]}", *excerpt]), flush=True)
        if (path := logs.path(i)) is not None:
            print(f"      log: {path}" if os.path.isfile(path) else
                  f"      log: no {ERR_FILE} in {logs.folders[i]} (the job failed before it took "
                  "its folder: " + ("the lines above are from its output)"
                                    if i in logs.captured else "see its output above)"),
                  flush=True)
    if len(failed) > FAILED_JOBS_SHOWN:
        print(f"  ... and {len(failed) - FAILED_JOBS_SHOWN} more (exit codes "
              f"{sorted(set(exit_codes[j] for j, _ in failed[FAILED_JOBS_SHOWN:]))}; see each "
              "job's err.txt)", flush=True)
    raise JobsFailed([commands[i] for i, _ in failed], len(commands),
                     [exit_codes[i] for i, _ in failed])


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a live (not zombie) member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc/self"):
        return True
    for entry in filter(str.isdigit, os.listdir("/proc")):  # Linux: skip zombies nobody reaped
        fields = []                                         # (e.g. under a container's PID 1)
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{entry}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # SIGHUP passed as SIGTERM
        os.killpg(pgid, signal.SIGTERM if signum == signal.SIGHUP else signum)


class JobProcesses:
    """Start jobs in their own process groups and forward stop signals to them (docs/sweep.md)."""

    def __init__(self, grace_period_s: float | None = None, poll_interval: float = 0.05):
        self.grace_period_s = stop_grace_period(grace_period_s)
        self.poll_interval = poll_interval
        self.running: dict[int, tuple[int, subprocess.Popen]] = {}  # pid -> (index, process)
        self.signum: int | None = None
        self.deadline: float | None = None
        self.interrupted: set[int] = set()  # indices running when the first signal came
        self.killed: list[int] = []  # indices SIGKILLed after the grace period
        self.forwarding = False
        self._announced = False
        self._catcher = SignalCatcher(self._on_signal)

    def __enter__(self) -> "JobProcesses":
        self._catcher.__enter__()
        self.forwarding = self._catcher.active
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.running and self.signum is None:  # leaving on an error: stop the jobs
                self._on_signal(signal.SIGTERM)
            while self.running:
                for _, proc in list(self.running.values()):
                    self.poll(proc)
                time.sleep(self.poll_interval)
        finally:
            self._catcher.__exit__(exc_type, exc, tb)

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    def _on_signal(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            self.deadline = time.monotonic() + self.grace_period_s
            self.interrupted = {index for index, _ in self.running.values()}
        for pid in list(self.running):
            _signal_group(pid, signum)

    def announce(self) -> None:
        """Print, once, what a stop signal does (from the main loop: no print interrupted)."""
        if self.stopping and not self._announced:
            self._announced = True
            print(f"\nReceived {signal_name(self.signum)}: forwarded to {len(self.running)} "
                  f"running job(s); no further job starts; waiting up to "
                  f"{self.grace_period_s:g} s for them to stop at a checkpoint.", flush=True)

    def start(self, index: int, command: str, env=None, cwd=None,
              log: str | None = None) -> subprocess.Popen | None:
        """Start ``command`` by ``/bin/sh``, or fork this interpreter's train (None: stopping)."""
        if self.stopping:
            return None
        train_args = forkable_train_args(command) if cwd is None else None
        if train_args is not None:
            proc = fork_train(train_args, new_session=self.forwarding, log=log, env=env)
        else:
            launcher_pid = os.getpid()
            _load_libc()
            with open(log, "ab") if log is not None else contextlib.nullcontext() as output:
                proc = subprocess.Popen(
                    f"exec {command}" if is_simple_command(command) else command, shell=True,
                    env=env, cwd=cwd, stdout=output,
                    stderr=subprocess.STDOUT if output is not None else None,
                    start_new_session=self.forwarding,
                    preexec_fn=lambda: (die_with_parent(), _exit_if_orphaned(launcher_pid)))
        self.running[proc.pid] = (index, proc)
        if self.stopping:  # the signal came while it was starting
            self.interrupted.add(index)
            _signal_group(proc.pid, self.signum)
        return proc

    def poll(self, proc: subprocess.Popen) -> int | None:
        """The job's exit status once it (after a stop, its group) exited; SIGKILL after grace."""
        index = self.running[proc.pid][0]
        killed = index in self.killed
        code = proc.poll()
        # after a stop, other processes of the job's group (e.g. a shell's child) may live on
        if code is not None and (killed or not (self.stopping and self.forwarding
                                               and _group_alive(proc.pid))):
            self.running.pop(proc.pid, None)
            return code
        if self.stopping and not killed and time.monotonic() >= self.deadline:
            self.killed.append(index)
            _signal_group(proc.pid, signal.SIGKILL)
        return None

    def wait(self, proc: subprocess.Popen) -> int:
        while (code := self.poll(proc)) is None:
            self.announce()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.poll_interval)
        return code

    def interruption(self, commands: Sequence[str], exit_codes: Sequence[int | None],
                     remote: bool = False) -> LaunchInterrupted:
        codes = list(exit_codes) + [None] * (len(commands) - len(exit_codes))
        interrupted = [commands[i] for i in sorted(self.interrupted) if codes[i] != 0]
        not_started = [c for i, c in enumerate(commands)
                       if codes[i] is None and i not in self.interrupted]
        notes = [f"still running after the {self.grace_period_s:g} s grace period: killed "
                 f"(SIGKILL): {commands[i]}" for i in self.killed]
        return LaunchInterrupted(self.signum, interrupted, not_started, codes, remote, notes)


def report_interrupted(name: str, commands: Sequence[str], err: LaunchInterrupted) -> None:
    """Print what a stop signal left: interrupted, not started, succeeded and failed commands."""
    finished = [i for i, code in enumerate(err.exit_codes)
                if code is not None and commands[i] not in err.interrupted]
    failed = [i for i in finished if err.exit_codes[i] != 0]
    print(f"{name} launcher: stopped by {signal_name(err.signum)}: {len(err.interrupted)} "
          f"interrupted, {len(err.not_started)} not started, {len(finished) - len(failed)} "
          f"succeeded, {len(failed)} failed before the signal.", flush=True)
    for i in failed:
        print(f"  exit code {err.exit_codes[i]}: {commands[i]}", flush=True)
    for note in err.notes:
        print(f"  {note}", flush=True)
