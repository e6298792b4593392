"""Job processes of the local, multi-GPU and submitit (local executor) launchers: starting a job in
its own process group (or forking it from a preloaded train server), forwarding stop signals to
it, waiting at most a grace period, and the failure and interruption summaries.

Stop signals (SIGTERM: Slurm preemption, ``timeout``, ``kill``; SIGINT: Ctrl-C; SIGHUP: the
terminal closing). DomainBed's launchers let the sweep die and leave the running job behind as an
orphan. Here, while ``local`` or ``multi_gpu`` run jobs (:class:`JobProcesses`):

* each job runs in its own session and process group, so a signal sent to the sweep's whole
  group (a terminal's Ctrl-C) does not reach it twice; the sweep forwards the signal it receives
  to every running job's process group (SIGHUP as SIGTERM), once per signal received;
* no further job starts; the sweep waits for the running jobs to stop at a safe point (train
  writes a checkpoint and exits 143 on SIGTERM), at most :func:`stop_grace_period` seconds
  (default 60; the sweep's ``--stop_grace_period`` or ``$DG_STOP_GRACE_PERIOD``), then SIGKILLs
  what is left of their process groups;
* the launcher raises :class:`LaunchInterrupted`, a ``SystemExit`` with status 128 + signal
  (143 SIGTERM, 130 SIGINT, 129 SIGHUP) naming the interrupted and never-started commands; the
  sweep prints them and the command that continues them (``--resume``).

A signal whose disposition is "ignore" when the launcher starts (e.g. SIGHUP under ``nohup``) is
left ignored. Outside the main thread no handler can be installed: jobs then stay in the
caller's process group, as before.

A SIGKILL (or any death) of the launcher cannot be forwarded; on Linux every job asks the kernel
for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`), so it
stops at its next checkpoint instead of training on as an orphan that holds its folder's lock;
the next ``sweep launch --resume`` continues it. Other systems have no such call: there a job
outlives a killed launcher, and a relaunch reports it as still running (its lock is held) and
leaves it alone.

Failures: a launcher that waited for its jobs raises :class:`JobsFailed` (a ``SystemExit`` with
status 1) after printing, per failed job, its exit code, the first error lines its run added to
``<output_dir>/err.txt`` and where that file is (:func:`report_exit_codes`). A job whose folder is
done, or still held by another live train process (``.lock``), when its command ends is not
counted as failed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Sequence

from dg_plugins.engine.signals import STOP_SIGNALS, SignalCatcher, signal_name, stop_grace_period


class LaunchInterrupted(SystemExit):
    """A launcher stopped early because this process received a stop signal.

    A ``SystemExit`` whose ``code`` is 128 + signal (143 SIGTERM, 130 SIGINT, 129 SIGHUP), so
    that, uncaught, it ends the process with the conventional status; ``except Exception`` does
    not swallow it. ``interrupted``: the commands that were running when the signal came and did
    not finish successfully; ``not_started``: those never started; ``exit_codes``: one per
    command (None: not run or unknown); ``remote``: the jobs keep running elsewhere (Slurm);
    ``notes``: lines for the user (e.g. jobs that had to be killed).
    """

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
    """Some jobs of a launcher that waited for them failed: a ``SystemExit`` with status 1 (so
    that, uncaught, a sweep script ends non-zero). ``failed``: the failed commands;
    ``exit_codes``: theirs (None: unknown); ``lines``: the summary printed for them;
    ``n_commands``: how many commands the launcher ran."""

    def __init__(self, failed: Sequence[str], n_commands: int, lines: Sequence[str] = (),
                 exit_codes: Sequence[int | None] | None = None):
        super().__init__(1)
        self.failed = list(failed)
        self.n_commands = n_commands
        self.lines = list(lines)
        self.exit_codes = list(exit_codes) if exit_codes is not None else [None] * len(failed)

    def __str__(self) -> str:
        return f"{len(self.failed)} of {self.n_commands} jobs failed"


ERROR_LOG = "err.txt"
#: Error lines shown per failed job, and failed jobs shown in full, in a failure summary.
ERROR_LINES_SHOWN = 3
FAILED_JOBS_SHOWN = 10


def command_output_dir(command: str) -> str | None:
    """The ``--output_dir`` of a job command (what the sweep writes), or None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for i, word in enumerate(words[:-1]):
        if word == "--output_dir":
            return words[i + 1]
    for word in words:
        if word.startswith("--output_dir="):
            return word.split("=", 1)[1]
    return None


class ErrorLogs:
    """Where each job's ``err.txt`` ends before the launcher runs it, so that a failure summary
    shows the lines this run added (the file is appended to across resumes)."""

    def __init__(self, commands: Sequence[str]):
        self.folders = [command_output_dir(c) for c in commands]
        self.offsets = [self._size(folder) for folder in self.folders]
        #: index -> the lines a job printed, where a launcher captured its output (used when
        #: the job wrote nothing to its err.txt: it failed before it took its folder)
        self.captured: dict[int, list[str]] = {}

    @staticmethod
    def _size(folder: str | None) -> int:
        try:
            return os.path.getsize(os.path.join(folder, ERROR_LOG)) if folder else 0
        except OSError:
            return 0

    def path(self, index: int) -> str | None:
        folder = self.folders[index]
        return os.path.join(folder, ERROR_LOG) if folder else None

    def new_lines(self, index: int) -> list[str]:
        """The non-empty lines job ``index`` added to its err.txt (all of it when the file
        shrank, e.g. a ``--force`` run started it over); without any, what the launcher
        captured of its output (:attr:`captured`)."""
        return self._err_lines(index) or self.captured.get(index, [])

    def _err_lines(self, index: int) -> list[str]:
        path = self.path(index)
        if path is None or not os.path.isfile(path):
            return []
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(self.offsets[index] if self.offsets[index] <= size else 0)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [line.rstrip() for line in text.splitlines() if line.strip()]


def error_excerpt(lines: Sequence[str], n: int = ERROR_LINES_SHOWN) -> list[str]:
    """The lines that say what went wrong: train's one-line ``error: ...`` / ``stopped: ...``
    messages when there are some, else the end of a traceback (its exception line)."""
    marked = [line for line in lines if line.startswith(("error:", "stopped:"))]
    if marked:
        return marked[:n]
    return list(lines[-n:])


def _done(folder: str | None) -> bool:
    return bool(folder) and os.path.exists(os.path.join(folder, "done"))


def report_exit_codes(name: str, commands: Sequence[str], exit_codes: Sequence[int],
                      logs: ErrorLogs | None = None) -> list[int]:
    """Print a one-line summary and, per failed job, its exit code, command, first error lines
    and err.txt; raise :class:`JobsFailed` when a job failed (return the failed indices when
    none did: ``[]``). A nonzero exit is not a failure when the job's folder is done (another
    process finished it) or still held by another live train process (``.lock``): the latter is
    reported as still running."""
    from dg_plugins.engine.job_folder import lock_holder

    logs = logs or ErrorLogs(commands)
    failed, running = [], []
    for i, code in enumerate(exit_codes):
        if code == 0 or _done(logs.folders[i]):
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
    lines = [f"{name} launcher: {len(failed)} of {len(commands)} commands failed:"]
    for shown, (i, _) in enumerate(failed):
        if shown == FAILED_JOBS_SHOWN:
            lines.append(f"  ... and {len(failed) - shown} more (exit codes "
                         f"{sorted(set(exit_codes[j] for j, _ in failed[shown:]))}; see each "
                         "job's err.txt)")
            break
        lines.append(f"  exit code {exit_codes[i]}: {commands[i]}")
        excerpt = error_excerpt(logs.new_lines(i))
        lines += [f"      {line}" for line in excerpt]
        path = logs.path(i)
        if path is not None:
            lines.append(f"      log: {path}" if os.path.isfile(path) else
                         f"      log: no {ERROR_LOG} in {logs.folders[i]} (the job failed before "
                         "it took its folder: " + ("the lines above are from its output)"
                                                   if i in logs.captured else
                                                   "see its output above)"))
    for line in lines:
        print(line, flush=True)
    raise JobsFailed([commands[i] for i, _ in failed], len(commands), lines,
                     [exit_codes[i] for i, _ in failed])


#: Words that ``exec`` cannot run (shell reserved words and builtins without a program).
_SHELL_WORDS = frozenset(
    "! { } case do done elif else esac fi for if in then until while . : alias break cd "
    "command continue eval exec exit export hash local read readonly return set shift source "
    "times trap type ulimit umask unalias unset wait".split())


def is_simple_command(command: str) -> bool:
    """True when ``command`` is a plain list of words (what the sweep builds): it equals its own
    ``shlex`` round trip, so it holds no shell syntax, and its first word is a program."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return (bool(words) and "=" not in words[0] and words[0] not in _SHELL_WORDS
            and shlex.join(words) == command)


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
    for entry in os.listdir("/proc"):  # Linux: skip zombies nobody reaped (e.g. under a
        if not entry.isdigit():        # container's PID 1 that does not reap)
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


#: ``0`` makes every job start a fresh interpreter instead (see :func:`forkable_train_args`).
FORK_ENV = "DG_PLUGINS_FORK_JOBS"
TRAIN_MODULE = "dg_plugins.scripts.train"
#: What a train job imports (torch, ``torch._dynamo``: the first optimizer imports it, about 2 s;
#: timm; the algorithms and datasets): the fork server imports it once (imports only: no tensor is
#: computed and no CUDA context made there, so its children start as cleanly as a new interpreter).
#: This module is among them, so the server holds the job body it forks (:func:`_train_in_child`)
#: from the start even if the package on disk changes during the sweep.
PRELOAD = ("dg_plugins.compat", "torch", "torch._dynamo", "dg_plugins.networks.vit",
           "dg_plugins.algorithms", "dg_plugins.datasets", TRAIN_MODULE, __name__)
_fork_context = None


# --------------------------------------------------------------------------------------------
# Jobs die with their launcher

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc = None


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
    """Linux: ask the kernel to send ``signum`` to this process when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``). Returns False where the call does not
    exist (other systems: the job then outlives a killed launcher). Called in a job's process
    right after fork, so it only uses what was loaded before (:func:`_load_libc`). The caller
    checks afterwards that the parent is still the one it forked from (a parent that died before
    the request sends nothing)."""
    libc = _load_libc()
    return libc is not None and libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def _exit_if_orphaned(parent_pid: int) -> None:
    """In a job's process before ``exec``: end at once (status 143, as a job stopped by SIGTERM
    before its first step) when the launcher that started it has already died."""
    if os.getppid() != parent_pid:
        os._exit(128 + signal.SIGTERM)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main_module_is_reimport_safe() -> bool:
    """Whether a forked job may start from this process's ``__main__``.

    multiprocessing's children (the fork server's included) re-run the parent's main module as
    ``__mp_main__`` when it is a script file (``python my_sweep.py``) or a module run with ``-m``;
    a script that drives the sweep without an ``if __name__ == "__main__":`` guard would then
    launch the sweep again inside each job. Safe: dg_plugins' own commands (guarded), a package's
    ``__main__`` (multiprocessing skips it, e.g. ``python -m pytest``), and a main without a file
    (``python -c``, an interactive session or notebook)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return (name == "__main__" or name.endswith(".__main__")
                or name.split(".")[0] == "dg_plugins")
    return getattr(main, "__file__", None) is None


def forkable_train_args(command: str) -> list[str] | None:
    """The train arguments when ``command`` is ``<this interpreter> -m dg_plugins.scripts.train
    ARGS`` (what the sweep writes), else None. Such a job is forked by a fork server that has
    imported torch, timm and the algorithms once (:func:`fork_train`), instead of paying that
    start-up (several seconds) in a fresh interpreter per job. ``DG_PLUGINS_FORK_JOBS=0`` turns
    this off, and a ``__main__`` that a forked child would re-run (a user's script, see
    :func:`main_module_is_reimport_safe`) makes every job a fresh interpreter instead."""
    if os.environ.get(FORK_ENV, "1") == "0" or not hasattr(os, "fork"):
        return None
    if not main_module_is_reimport_safe():
        return None
    if not is_simple_command(command):
        return None
    words = shlex.split(command)
    if len(words) < 3 or words[0] != sys.executable or words[1:3] != ["-m", TRAIN_MODULE]:
        return None
    return words[3:]


def _release_fork_server() -> None:
    """In a forked job: close the job's copy of the fork server's "alive" pipe. multiprocessing
    hands every child of the server a copy (so that the child could ask the server for processes
    too), and the server exits only when the last copy closes: without this, the server would
    outlive a killed launcher for as long as the job runs, and the job, which asks for SIGTERM
    when the server dies (:func:`die_with_parent`), would train on. The job never asks the
    launcher's server for processes (its own children use the job's start method)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None
    if hasattr(server, "_forkserver_address"):
        server._forkserver_address = None


def _redirect_output(log: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to the file ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _train_in_child(args: list[str], environ: dict, cwd: str, new_session: bool,
                    ignored: tuple[int, ...], launcher_pid: int | None = None,
                    log: str | None = None) -> None:
    """The body of a forked job: its output to ``log`` when given, this launcher's environment
    and folder, its own session when
    ``new_session`` (as ``Popen(start_new_session=True)``), a fresh interpreter's stop-signal
    dispositions (one ignored by the launcher stays ignored, as across ``exec``) and
    multiprocessing start method, SIGTERM when its parent (the fork server, which exits when the
    launcher dies) dies (:func:`die_with_parent`), then train's ``main``; its status becomes the
    process's exit code."""
    server_pid = os.getppid()
    if log is not None:
        _redirect_output(log)
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    for signum in STOP_SIGNALS:
        if int(signum) in ignored:
            signal.signal(signum, signal.SIG_IGN)
        elif signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
        else:
            signal.signal(signum, signal.SIG_DFL)
    # A forkserver child inherits the fork server's start method ("forkserver"); a fresh
    # interpreter has the platform's default. Without this reset, the job's own children (loader
    # workers) would be started by the launcher's fork server, not by the job.
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)
    _release_fork_server()
    die_with_parent()
    if os.getppid() != server_pid or (launcher_pid is not None and not _pid_alive(launcher_pid)):
        sys.exit(128 + signal.SIGTERM)  # the launcher died while this job was being forked
    # The command's module, found by the name the command gives it (as ``-m`` finds it; the fork
    # server has imported it): the engine itself never imports the scripts layer above it.
    train = importlib.import_module(TRAIN_MODULE)
    sys.argv = [train.__file__, *args]
    sys.exit(train.main(args))


class ForkedJob:
    """A train job started by the fork server, with the part of ``subprocess.Popen``'s interface
    that :class:`JobProcesses` uses (``pid``, ``poll``, ``wait``, ``returncode``: ``-N`` when
    signal N ended it)."""

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


def fork_train(args: Sequence[str], new_session: bool, log: str | None = None) -> ForkedJob:
    """Start ``python -m dg_plugins.scripts.train ARGS`` as a child of multiprocessing's fork
    server, which imported :data:`PRELOAD` once (see :func:`forkable_train_args`); its output
    goes to the file ``log`` when given."""
    global _fork_context
    import multiprocessing

    if _fork_context is None:
        _fork_context = multiprocessing.get_context("forkserver")
        _fork_context.set_forkserver_preload(list(PRELOAD))
    ignored = tuple(int(s) for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    process = _fork_context.Process(target=_train_in_child, name="train",
                                    args=(list(args), dict(os.environ), os.getcwd(),
                                          new_session, ignored, os.getpid(), log))
    process.start()
    return ForkedJob(process)


class JobProcesses:
    """Start jobs (shell commands) and forward stop signals to them; a context manager.

    While active in the main thread, SIGTERM, SIGINT and SIGHUP (those not ignored) are caught
    (:class:`dg_plugins.engine.signals.SignalCatcher`):
    each one received is forwarded to the process group of every running job (SIGHUP as
    SIGTERM), :meth:`start` refuses new jobs, and :meth:`poll` / :meth:`wait` enforce the grace
    period: once it has passed, the jobs' process groups get SIGKILL. Each job starts in its own
    session (hence process group) so that a terminal's Ctrl-C, sent to the sweep's group, does
    not reach it a second time. A plain command (:func:`is_simple_command`) is ``exec``'ed by the
    shell, so the job's own process is the group leader and its exit status is the job's; other
    commands keep the shell as parent, and after a stop the wait lasts until the whole group has
    exited. On leaving, previous handlers are restored; if leaving on an error, running jobs are
    stopped (SIGTERM, grace period, SIGKILL) so that none is orphaned.
    """

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

    # -- context --------------------------------------------------------------------------

    def __enter__(self) -> "JobProcesses":
        self._catcher.__enter__()
        self.forwarding = self._catcher.active
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.running:  # leaving on an error with jobs still running: stop them
                if self.signum is None:
                    self._on_signal(signal.SIGTERM)
                while self.running:
                    for pid, (_, proc) in list(self.running.items()):
                        self.poll(proc)
                    time.sleep(self.poll_interval)
        finally:
            self._catcher.__exit__(exc_type, exc, tb)

    # -- signals --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    def _on_signal(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            self.deadline = time.monotonic() + self.grace_period_s
            self.interrupted = {index for index, _ in self.running.values()}
        forwarded = signal.SIGTERM if signum == signal.SIGHUP else signum
        for pid in list(self.running):
            _signal_group(pid, forwarded)

    def announce(self, out=None) -> None:
        """Print, once, what happens after a stop signal (called from the main loop, not from
        the handler, so that no print is interrupted by another)."""
        if self.stopping and not self._announced:
            self._announced = True
            print(f"\nReceived {signal_name(self.signum)}: forwarded to {len(self.running)} "
                  f"running job(s); no further job starts; waiting up to "
                  f"{self.grace_period_s:g} s for them to stop at a checkpoint.",
                  file=out or sys.stdout, flush=True)

    # -- jobs -----------------------------------------------------------------------------

    def start(self, index: int, command: str, env=None, cwd=None,
              log: str | None = None) -> subprocess.Popen | None:
        """Start ``command`` through ``/bin/sh``, or fork it when it is this interpreter's train
        (:func:`forkable_train_args`; None when stopping: no new job); its stdout and stderr
        go to the file ``log`` when given."""
        if self.stopping:
            return None
        train_args = forkable_train_args(command) if env is None and cwd is None else None
        if train_args is not None:
            proc = fork_train(train_args, new_session=self.forwarding, log=log)
        else:
            shell_command = f"exec {command}" if is_simple_command(command) else command
            launcher_pid = os.getpid()
            _load_libc()
            output = open(log, "ab") if log is not None else None
            try:
                proc = subprocess.Popen(
                    shell_command, shell=True, env=env, cwd=cwd, stdout=output,
                    stderr=subprocess.STDOUT if output is not None else None,
                    start_new_session=self.forwarding,
                    preexec_fn=lambda: (die_with_parent(), _exit_if_orphaned(launcher_pid)))
            finally:
                if output is not None:
                    output.close()
        self.running[proc.pid] = (index, proc)
        if self.stopping:  # the signal came while it was starting
            self.interrupted.add(index)
            _signal_group(proc.pid, signal.SIGTERM if self.signum == signal.SIGHUP
                          else self.signum)
        return proc

    def poll(self, proc: subprocess.Popen) -> int | None:
        """The job's exit status once it (and, after a stop, its whole process group) has
        exited, else None; once the grace period has passed, SIGKILL its process group."""
        index = self.running[proc.pid][0]
        killed = index in self.killed
        code = proc.poll()
        if code is not None and (killed or not self._group_pending(proc.pid)):
            self.running.pop(proc.pid, None)
            return code
        if self.stopping and not killed and time.monotonic() >= self.deadline:
            self.killed.append(index)
            _signal_group(proc.pid, signal.SIGKILL)
        return None

    def _group_pending(self, pgid: int) -> bool:
        """After a stop: whether other processes of the job's group (e.g. a shell's child)
        are still running."""
        return self.stopping and self.forwarding and _group_alive(pgid)

    def wait(self, proc: subprocess.Popen) -> int:
        """Block until :meth:`poll` gives the job's exit status."""
        while True:
            code = self.poll(proc)
            if code is not None:
                return code
            self.announce()
            try:
                proc.wait(timeout=self.poll_interval)
            except subprocess.TimeoutExpired:
                pass

    def interruption(self, commands: Sequence[str], exit_codes: Sequence[int | None],
                     remote: bool = False) -> LaunchInterrupted:
        """The :class:`LaunchInterrupted` describing this stop."""
        interrupted = [commands[i] for i in sorted(self.interrupted)
                       if i < len(exit_codes) and exit_codes[i] != 0]
        not_started = [c for i, c in enumerate(commands)
                       if (i >= len(exit_codes) or exit_codes[i] is None)
                       and i not in self.interrupted]
        notes = [f"still running after the {self.grace_period_s:g} s grace period: killed "
                 f"(SIGKILL): {commands[i]}" for i in self.killed]
        codes = list(exit_codes) + [None] * (len(commands) - len(exit_codes))
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
