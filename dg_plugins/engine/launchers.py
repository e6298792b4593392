"""Command launchers (``domainbed/command_launchers.py``): each is ``fn(commands: list[str]) -> None``.

Importing this module registers ``dummy``, ``local``, ``multi_gpu`` and ``submitit`` in
:data:`dg_plugins.registry.LAUNCHERS`. No launcher imports torch or submitit at module import.

Differences from DomainBed's launchers (``domainbed/command_launchers.py``):

* ``local`` reports progress and prints the failed commands at the end (DomainBed ignores exit
  codes); a failing job never stops the others and nothing is raised.
* ``multi_gpu`` raises when no GPU is visible (DomainBed spins forever), passes the GPU through the
  environment rather than a command prefix, and reports failures like ``local``.
* ``submitit`` is new: one Slurm job array (or submitit's local/debug executor for testing),
  configured by :func:`configure_submitit` (the sweep's ``--slurm_*`` flags) or ``DG_SLURM_*``
  environment variables.

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
caller's process group, as before. A SIGKILL to the sweep cannot be forwarded.

``submitit``: on Slurm (``--slurm_cluster slurm``) the jobs live on the cluster, not under the
sweep: a signal to a sweep that waits for them only stops the waiting (status 128 + signal) and
prints how to cancel them (``scancel <job id>``); nothing runs locally. Slurm itself signals
every process of a preempted or timed-out job. With the ``local`` and ``debug`` executors the jobs
run on this machine: each runs under :func:`run_shell_command`, which forwards SIGTERM/SIGINT to
the job's process group like ``local``, and a signal to the sweep is passed to every running job
(through submitit's controller, which forwards SIGTERM), the sweep waits for them as above, and
cancels what is left after the grace period. Caveat: a Ctrl-C typed in the terminal also reaches
submitit's local controller directly, which kills its task wrappers after about a second; the jobs
have received the SIGINT by then and still stop at their next checkpoint on their own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

from dg_plugins.registry import LAUNCHERS


def _report(name: str, commands: Sequence[str], exit_codes: Sequence[int]) -> list[int]:
    """Print a one-line summary and every failed command; return the failed indices."""
    failed = [i for i, code in enumerate(exit_codes) if code != 0]
    if failed:
        print(f"{name} launcher: {len(failed)} of {len(commands)} commands failed:", flush=True)
        for i in failed:
            print(f"  exit code {exit_codes[i]}: {commands[i]}", flush=True)
    else:
        print(f"{name} launcher: all {len(commands)} commands succeeded.", flush=True)
    return failed


# --------------------------------------------------------------------------------------------
# Stop signals: jobs in their own process groups, signals forwarded, bounded wait

#: Signals that stop a sweep and are forwarded to its running jobs (SIGHUP as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_STOP_GRACE_PERIOD_S = 60.0
STOP_GRACE_PERIOD_ENV = "DG_STOP_GRACE_PERIOD"
_configured_grace_period: float | None = None
#: The last stop signal received by a handler of this module in this process (None: none yet).
_last_stop_signal: int | None = None


def configure_stop(grace_period_s: float | None = None) -> None:
    """Set the grace period of :func:`stop_grace_period` (the sweep's ``--stop_grace_period``);
    None restores the environment/default."""
    global _configured_grace_period
    if grace_period_s is not None and grace_period_s < 0:
        raise ValueError(f"the stop grace period must be >= 0 seconds, got {grace_period_s}")
    _configured_grace_period = grace_period_s


def stop_grace_period(override: float | None = None) -> float:
    """Seconds to wait for jobs to stop after a stop signal before SIGKILL: ``override``, else
    :func:`configure_stop`'s value, else ``$DG_STOP_GRACE_PERIOD``, else 60."""
    for value in (override, _configured_grace_period):
        if value is not None:
            return float(value)
    text = os.environ.get(STOP_GRACE_PERIOD_ENV)
    if text is None:
        return DEFAULT_STOP_GRACE_PERIOD_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"bad value for ${STOP_GRACE_PERIOD_ENV}: {text!r} (seconds, >= 0)")
    return value


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
PRELOAD = ("dg_plugins.compat", "torch", "torch._dynamo", "dg_plugins.networks.vit",
           "dg_plugins.algorithms", "dg_plugins.datasets", TRAIN_MODULE)
_fork_context = None


def forkable_train_args(command: str) -> list[str] | None:
    """The train arguments when ``command`` is ``<this interpreter> -m dg_plugins.scripts.train
    ARGS`` (what the sweep writes), else None. Such a job is forked by a fork server that has
    imported torch, timm and the algorithms once (:func:`fork_train`), instead of paying that
    start-up (several seconds) in a fresh interpreter per job. ``DG_PLUGINS_FORK_JOBS=0`` turns
    this off."""
    if os.environ.get(FORK_ENV, "1") == "0" or not hasattr(os, "fork"):
        return None
    if not is_simple_command(command):
        return None
    words = shlex.split(command)
    if len(words) < 3 or words[0] != sys.executable or words[1:3] != ["-m", TRAIN_MODULE]:
        return None
    return words[3:]


def _train_in_child(args: list[str], environ: dict, cwd: str, new_session: bool,
                    ignored: tuple[int, ...]) -> None:
    """The body of a forked job: this launcher's environment and folder, its own session when
    ``new_session`` (as ``Popen(start_new_session=True)``), a fresh interpreter's stop-signal
    dispositions (one ignored by the launcher stays ignored, as across ``exec``) and
    multiprocessing start method, then train's ``main``; its status becomes the process's exit
    code."""
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
    from dg_plugins.scripts import train

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


def fork_train(args: Sequence[str], new_session: bool) -> ForkedJob:
    """Start ``python -m dg_plugins.scripts.train ARGS`` as a child of multiprocessing's fork
    server, which imported :data:`PRELOAD` once (see :func:`forkable_train_args`)."""
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
                                          new_session, ignored))
    process.start()
    return ForkedJob(process)


class JobProcesses:
    """Start jobs (shell commands) and forward stop signals to them; a context manager.

    While active in the main thread, SIGTERM, SIGINT and SIGHUP (those not ignored) are caught:
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
        self._previous: dict[int, object] = {}

    # -- context --------------------------------------------------------------------------

    def __enter__(self) -> "JobProcesses":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_IGN:
                    continue  # e.g. SIGHUP under nohup: stay immune
                self._previous[signum] = signal.signal(signum, self._on_signal)
            self.forwarding = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.running:  # leaving on an error with jobs still running: stop them
                if self.signum is None:
                    self._on_signal(signal.SIGTERM, None)
                while self.running:
                    for pid, (_, proc) in list(self.running.items()):
                        self.poll(proc)
                    time.sleep(self.poll_interval)
        finally:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous = {}

    # -- signals --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    def _on_signal(self, signum, frame) -> None:
        global _last_stop_signal
        _last_stop_signal = signum
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

    def start(self, index: int, command: str, env=None, cwd=None) -> subprocess.Popen | None:
        """Start ``command`` through ``/bin/sh``, or fork it when it is this interpreter's train
        (:func:`forkable_train_args`; None when stopping: no new job)."""
        if self.stopping:
            return None
        train_args = forkable_train_args(command) if env is None and cwd is None else None
        if train_args is not None:
            proc = fork_train(train_args, new_session=self.forwarding)
        else:
            shell_command = f"exec {command}" if is_simple_command(command) else command
            proc = subprocess.Popen(shell_command, shell=True, env=env, cwd=cwd,
                                    start_new_session=self.forwarding)
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


def _report_interrupted(name: str, commands: Sequence[str], err: LaunchInterrupted) -> None:
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


# --------------------------------------------------------------------------------------------
# dummy and local


def dummy_launcher(commands: list[str]) -> None:
    """Print ``Dummy launcher: <cmd>`` for each command; run nothing."""
    for command in commands:
        print(f"Dummy launcher: {command}")


def run_sequentially(commands: Sequence[str], progress: bool | None = None,
                     grace_period_s: float | None = None) -> list[int]:
    """Run each command through the shell, one after another; return the exit codes.

    Progress: a tqdm bar on stderr when ``progress`` (default: stderr is a terminal), otherwise a
    plain ``[i/N] <cmd>`` line on stdout before each job. A stop signal is forwarded to the
    running job; then no further job starts and :class:`LaunchInterrupted` is raised once the
    job has exited (see :class:`JobProcesses`; ``grace_period_s`` overrides
    :func:`stop_grace_period`).
    """
    if progress is None:
        progress = sys.stderr.isatty()
    codes: list[int] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(commands), desc="jobs", unit="job", file=sys.stderr)
    try:
        with JobProcesses(grace_period_s) as jobs:
            for i, command in enumerate(commands):
                if jobs.stopping:
                    break
                if not progress:
                    print(f"[{i + 1}/{len(commands)}] {command}", flush=True)
                proc = jobs.start(i, command)
                if proc is None:
                    break
                codes.append(jobs.wait(proc))
                if bar is not None:
                    bar.update()
            if jobs.stopping:
                raise jobs.interruption(commands, codes)
    finally:
        if bar is not None:
            bar.close()
    return codes


def local_launcher(commands: list[str]) -> None:
    """Run the commands serially on this machine; summarize failures at the end. A stop signal
    ends the sweep after the running job stopped (see the module docstring)."""
    try:
        codes = run_sequentially(commands)
    except LaunchInterrupted as err:
        _report_interrupted("local", commands, err)
        raise
    _report("local", commands, codes)


# --------------------------------------------------------------------------------------------
# multi_gpu


def visible_gpus() -> list[str]:
    """GPU ids from ``CUDA_VISIBLE_DEVICES`` (comma-split, empty entries dropped) when set, else
    ``range(torch.cuda.device_count())`` (torch imported only then)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [gpu.strip() for gpu in env.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_on_gpus(commands: Sequence[str], gpus: Sequence[str],
                poll_interval: float = 1.0, grace_period_s: float | None = None) -> list[int]:
    """Run the commands in order, at most one per GPU at a time, each with
    ``CUDA_VISIBLE_DEVICES=<its gpu>``; poll every ``poll_interval`` s; return the exit codes.
    A stop signal is forwarded to every running job and raises :class:`LaunchInterrupted` once
    they have exited (see :class:`JobProcesses`)."""
    gpus = list(gpus)
    if not gpus:
        raise RuntimeError(
            "multi_gpu launcher: no GPU visible (CUDA_VISIBLE_DEVICES is empty or "
            "torch.cuda.device_count() is 0); use the local launcher on CPU machines"
        )
    codes: list[int | None] = [None] * len(commands)
    running: dict[str, tuple[int, subprocess.Popen]] = {}
    pending = list(enumerate(commands))
    with JobProcesses(grace_period_s) as jobs:
        while (pending and not jobs.stopping) or running:
            for gpu, (index, proc) in list(running.items()):
                code = jobs.poll(proc)
                if code is not None:
                    codes[index] = code
                    del running[gpu]
            for gpu in gpus:
                if pending and gpu not in running and not jobs.stopping:
                    index, command = pending.pop(0)
                    print(f"[{index + 1}/{len(commands)}] GPU {gpu}: {command}", flush=True)
                    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
                    proc = jobs.start(index, command, env=env)
                    if proc is None:
                        pending.insert(0, (index, command))
                        break
                    running[gpu] = (index, proc)
            jobs.announce()
            if running:
                time.sleep(min(poll_interval, 0.1) if jobs.stopping else poll_interval)
        if jobs.stopping:
            raise jobs.interruption(commands, codes)
    return [int(code) for code in codes]


def multi_gpu_launcher(commands: list[str], gpus: Sequence[str] | None = None,
                       poll_interval: float = 1.0) -> None:
    """One job per visible GPU at a time (``gpus`` overrides :func:`visible_gpus`)."""
    gpus = visible_gpus() if gpus is None else gpus
    try:
        codes = run_on_gpus(commands, gpus, poll_interval)
    except LaunchInterrupted as err:
        _report_interrupted("multi_gpu", commands, err)
        raise
    _report("multi_gpu", commands, codes)


# --------------------------------------------------------------------------------------------
# submitit (Slurm job arrays; submitit's local/debug executors for testing)

SUBMITIT_CLUSTERS = ("slurm", "local", "debug")


@dataclasses.dataclass
class SubmititOptions:
    """Settings of the ``submitit`` launcher; None means "not set here".

    Each field can also come from an environment variable (:data:`SUBMITIT_ENV_VARS`). Defaults
    when unset everywhere: cluster ``slurm``; time 1440 min (submitit's own Slurm default is 5);
    gpus_per_node 1 on Slurm, 0 otherwise; partition, cpus_per_task, mem_gb: the cluster's
    defaults; array_parallelism 256 (submitit's default; Slurm only, the local executor starts
    every task at once); log_dir ``<sweep output_dir>/submitit_logs`` (derived from the
    commands' ``--output_dir``); wait False on Slurm (return after submission), True on
    local/debug (the debug executor only runs jobs while waited on, so it always waits);
    extra: more ``executor.update_parameters`` keywords, e.g. ``{"slurm_account": "abc"}``.
    """

    cluster: str | None = None
    partition: str | None = None
    time_min: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    array_parallelism: int | None = None
    log_dir: str | None = None
    wait: bool | None = None
    extra: dict | None = None


#: Environment variable of each :class:`SubmititOptions` field.
SUBMITIT_ENV_VARS = {
    "cluster": "DG_SLURM_CLUSTER",
    "partition": "DG_SLURM_PARTITION",
    "time_min": "DG_SLURM_TIME",
    "gpus_per_node": "DG_SLURM_GPUS_PER_NODE",
    "cpus_per_task": "DG_SLURM_CPUS_PER_TASK",
    "mem_gb": "DG_SLURM_MEM_GB",
    "array_parallelism": "DG_SLURM_ARRAY_PARALLELISM",
    "log_dir": "DG_SLURM_LOG_DIR",
    "wait": "DG_SLURM_WAIT",
    "extra": "DG_SLURM_EXTRA",
}

#: Module-level settings the sweep CLI fills from its ``--slurm_*`` flags; they win over the
#: environment. Change through :func:`configure_submitit`.
SUBMITIT_OPTIONS = SubmititOptions()


def configure_submitit(reset: bool = False, **options) -> SubmititOptions:
    """Set fields of :data:`SUBMITIT_OPTIONS` (None values are ignored; ``reset`` clears all
    first). Unknown option names raise."""
    global SUBMITIT_OPTIONS
    if reset:
        SUBMITIT_OPTIONS = SubmititOptions()
    names = {f.name for f in dataclasses.fields(SubmititOptions)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"unknown submitit option(s) {unknown}; valid: {sorted(names)}")
    SUBMITIT_OPTIONS = dataclasses.replace(
        SUBMITIT_OPTIONS, **{k: v for k, v in options.items() if v is not None})
    return SUBMITIT_OPTIONS


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use 1/0, true/false, yes/no)")


def parse_json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


_PARSERS = {"time_min": int, "gpus_per_node": int, "cpus_per_task": int, "mem_gb": float,
            "array_parallelism": int, "wait": _parse_bool, "extra": parse_json_object}


def options_from_env(environ=None) -> SubmititOptions:
    """The fields set through ``DG_SLURM_*`` variables; a bad value raises naming the variable."""
    environ = os.environ if environ is None else environ
    values = {}
    for name, var in SUBMITIT_ENV_VARS.items():
        if var in environ:
            try:
                values[name] = _PARSERS.get(name, str)(environ[var])
            except ValueError as err:
                raise ValueError(f"bad value for ${var}: {err}") from None
    return SubmititOptions(**values)


def sweep_dir_of(commands: Sequence[str]) -> str | None:
    """The sweep output_dir: the parent of the first command's ``--output_dir``, if any."""
    for command in commands[:1]:
        tokens = shlex.split(command)
        if "--output_dir" in tokens[:-1]:
            return os.path.dirname(os.path.normpath(tokens[tokens.index("--output_dir") + 1]))
    return None


def resolve_submitit_options(commands: Sequence[str] = (),
                             overrides: SubmititOptions | None = None,
                             environ=None) -> SubmititOptions:
    """Merge, highest first: ``overrides``, :data:`SUBMITIT_OPTIONS`, the environment, defaults
    (see :class:`SubmititOptions`). Every field of the result is set except partition,
    cpus_per_task and mem_gb (None there means the cluster default)."""
    merged = SubmititOptions()
    for layer in (options_from_env(environ), SUBMITIT_OPTIONS, overrides or SubmititOptions()):
        merged = dataclasses.replace(merged, **{
            f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)
            if getattr(layer, f.name) is not None})
    cluster = merged.cluster or "slurm"
    if cluster not in SUBMITIT_CLUSTERS:
        raise ValueError(f"unknown submitit cluster {cluster!r}; choices: "
                         f"{', '.join(SUBMITIT_CLUSTERS)}")
    sweep_dir = sweep_dir_of(commands)
    defaults = SubmititOptions(
        cluster=cluster,
        time_min=24 * 60,
        gpus_per_node=1 if cluster == "slurm" else 0,
        array_parallelism=256,
        log_dir=os.path.join(sweep_dir if sweep_dir is not None else ".", "submitit_logs"),
        wait=cluster != "slurm",
        extra={},
    )
    resolved = dataclasses.replace(defaults, **{
        f.name: getattr(merged, f.name) for f in dataclasses.fields(merged)
        if getattr(merged, f.name) is not None})
    if cluster == "debug":
        resolved.wait = True
    return resolved


def run_shell_command(command: str, cwd: str | None = None, forward_signals: bool = False,
                      grace_period_s: float | None = None) -> int:
    """One array task: run ``command`` through the shell in ``cwd`` (the directory the sweep was
    launched from, so relative paths keep their meaning). A nonzero exit raises, so that the
    scheduler marks the task failed.

    With ``forward_signals`` (submitit's local and debug executors, where the task runs on the
    sweep's machine) the command runs under :class:`JobProcesses`: SIGTERM/SIGINT to the task are
    forwarded to the command's process group, which is waited for (``grace_period_s``, then
    SIGKILL). On Slurm the command stays in the task's process group: Slurm signals every process
    of a job itself, and submitit's own handlers stay in place.
    """
    if forward_signals:
        with JobProcesses(grace_period_s) as jobs:
            proc = jobs.start(0, command, cwd=cwd)
            code = jobs.wait(proc) if proc is not None else 128 + jobs.signum
    else:
        code = subprocess.call(command, shell=True, cwd=cwd)
    if code != 0:
        raise RuntimeError(f"command exited with code {code}: {command}")
    return code


class _SignalCatcher:
    """Catch the stop signals (those not ignored, main thread only) while active: record the
    signal in ``signum`` and in :data:`_last_stop_signal`, then call ``on_signal(signum)``."""

    def __init__(self, on_signal: Callable[[int], None] = lambda signum: None):
        self.on_signal = on_signal
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "_SignalCatcher":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) != signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        global _last_stop_signal
        _last_stop_signal = signum
        if self.signum is None:
            self.signum = signum
        self.on_signal(signum)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


def _import_submitit():
    try:
        import submitit
    except ImportError as err:
        raise ImportError(
            "the submitit launcher needs the submitit package: pip install 'dg_plugins[slurm]' "
            "(or pip install submitit)"
        ) from err
    return submitit


def make_executor(options: SubmititOptions):
    """A ``submitit.AutoExecutor`` configured from fully resolved ``options``."""
    submitit = _import_submitit()
    executor = submitit.AutoExecutor(folder=options.log_dir, cluster=options.cluster)
    params = {"name": "dg_sweep", "timeout_min": options.time_min,
              "gpus_per_node": options.gpus_per_node, "cpus_per_task": options.cpus_per_task,
              "mem_gb": options.mem_gb, "slurm_partition": options.partition,
              "slurm_array_parallelism": options.array_parallelism}
    params.update(options.extra or {})
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def submit_commands(commands: Sequence[str], options: SubmititOptions | None = None) -> list:
    """Submit every command as one task of a job array (``executor.map_array``); when
    ``options.wait``, wait for all and print a failure summary. Returns the submitit jobs.

    Stop signals (see the module docstring): on Slurm, a signal while waiting raises
    :class:`LaunchInterrupted` at once with ``remote=True`` (the jobs keep running on the
    cluster). With the local/debug executors the jobs run here: a signal is passed on to them
    (:func:`run_shell_command` forwards it to the job), the sweep waits for them, at most the
    grace period, cancels what is left, and raises :class:`LaunchInterrupted`.
    """
    global _last_stop_signal
    options = resolve_submitit_options(commands, overrides=options)
    commands = list(commands)
    if not commands:
        return []
    executor = make_executor(options)
    cwd = os.getcwd()
    on_machine = options.cluster != "slurm"
    grace = stop_grace_period()
    _last_stop_signal = None
    jobs: list = []

    def pass_on(signum: int) -> None:  # local executor: via each job's controller process,
        for job in jobs:               # which forwards SIGTERM to its task
            process = getattr(job, "_process", None)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)

    with (_SignalCatcher(pass_on) if on_machine else _NoCatcher()) as catcher:
        jobs = executor.map_array(run_shell_command, commands, [cwd] * len(commands),
                                  [on_machine] * len(commands), [grace] * len(commands))
        ids = [job.job_id for job in jobs]
        print(f"submitit launcher: submitted {len(jobs)} jobs to {options.cluster} "
              f"(ids {ids[0]}..{ids[-1]}); logs in {options.log_dir}", flush=True)
        if catcher.signum is not None:  # a signal came during the submission
            pass_on(catcher.signum)
        if not options.wait:
            return jobs
        if options.cluster == "slurm":
            codes = _wait_slurm(commands, jobs)
        elif options.cluster == "local":
            codes = _wait_local(commands, jobs, catcher, grace)
        else:
            codes = _wait_debug(commands, jobs)
    _report("submitit", commands, codes)
    return jobs


class _NoCatcher:
    signum = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _job_exit_code(job) -> int:
    """0, or the exit code of a finished job's command (1 when unknown)."""
    # exception() waits and returns the error; the debug executor's result() would open pdb.
    try:
        err = job.exception()
    except Exception as raised:  # noqa: BLE001  (e.g. UncompletedJobError)
        err = raised
    if err is not None:
        print(f"submitit job {job.job_id} failed; log: {job.paths.stderr}", flush=True)
    return 0 if err is None else _exit_code_of(err)


def _wait_slurm(commands: Sequence[str], jobs: Sequence) -> list[int]:
    """Wait for every job; a stop signal stops the waiting only (the jobs run on the cluster)."""
    codes: list[int | None] = [None] * len(jobs)

    def stop_waiting(signum: int) -> None:
        array_id = str(jobs[0].job_id).split("_")[0]
        running = [c for c, code in zip(commands, codes) if code is None]
        raise LaunchInterrupted(signum, running, [], codes, remote=True, notes=[
            f"the jobs keep running on the cluster; cancel them with: scancel {array_id}"])

    with _SignalCatcher(stop_waiting):
        for i, job in enumerate(jobs):
            codes[i] = _job_exit_code(job)
    return [int(c) for c in codes]


def _wait_local(commands: Sequence[str], jobs: Sequence, catcher: _SignalCatcher,
                grace: float) -> list[int]:
    """Poll the local executor's jobs (all started at once); after a stop signal wait at most
    ``grace`` seconds (plus a little for submitit's own bookkeeping), then cancel the rest."""
    codes: list[int | None] = [None] * len(jobs)
    pending = set(range(len(jobs)))
    running_at_stop: set[int] = set()
    deadline = None
    cancelled: list[int] = []
    while pending:
        for i in sorted(pending):
            if jobs[i].done():
                codes[i] = _job_exit_code(jobs[i])
                pending.discard(i)
        if catcher.signum is not None and deadline is None:
            running_at_stop = set(pending)
            deadline = time.monotonic() + grace + 5.0
            print(f"\nReceived {signal_name(catcher.signum)}: passed to {len(pending)} running "
                  f"job(s); waiting up to {grace:g} s for them to stop at a checkpoint.",
                  flush=True)
        if deadline is not None and pending and time.monotonic() >= deadline:
            for i in sorted(pending):
                jobs[i].cancel()
                cancelled.append(i)
            deadline = float("inf")
        if pending:
            time.sleep(0.1)
    if catcher.signum is None:
        return [int(c) for c in codes]
    notes = [f"still running after the {grace:g} s grace period: cancelled: {commands[i]}"
             for i in cancelled]
    raise LaunchInterrupted(catcher.signum,
                            [commands[i] for i in sorted(running_at_stop) if codes[i] != 0],
                            [], codes, notes=notes)


def _wait_debug(commands: Sequence[str], jobs: Sequence) -> list[int]:
    """The debug executor runs each job in this process when it is waited on; a stop signal
    (forwarded to the running job by :func:`run_shell_command`) ends the loop: the remaining
    jobs never start."""
    codes: list[int | None] = [None] * len(jobs)
    for i, job in enumerate(jobs):
        if _last_stop_signal is not None:
            break
        codes[i] = _job_exit_code(job)
        if _last_stop_signal is not None and codes[i] != 0:
            raise LaunchInterrupted(_last_stop_signal, [commands[i]], commands[i + 1:], codes)
    if _last_stop_signal is not None:
        started = [i for i, c in enumerate(codes) if c is not None]
        raise LaunchInterrupted(_last_stop_signal, [], commands[len(started):], codes)
    return [int(c) for c in codes]


def _exit_code_of(err: Exception) -> int:
    """The child's exit code from a task error (its message or the remote traceback), or 1."""
    codes = re.findall(r"command exited with code (-?\d+)", str(err))
    return int(codes[-1]) if codes else 1


def submitit_launcher(commands: list[str]) -> None:
    """Run the commands as a submitit job array, configured by :data:`SUBMITIT_OPTIONS` and the
    ``DG_SLURM_*`` environment (see :class:`SubmititOptions`)."""
    try:
        submit_commands(commands)
    except LaunchInterrupted as err:
        _report_interrupted("submitit", commands, err)
        raise


def make_submitit_launcher(**options) -> Callable[[list], None]:
    """A launcher with its own submitit options (they win over every other source)."""
    overrides = SubmititOptions(**options)

    def launcher(commands: list[str]) -> None:
        try:
            submit_commands(commands, overrides)
        except LaunchInterrupted as err:
            _report_interrupted("submitit", commands, err)
            raise

    return launcher


# --------------------------------------------------------------------------------------------
# Registration


def _register(name: str, fn: Callable) -> None:
    """Register, replacing an entry only when it comes from this module (a reload)."""
    if name in LAUNCHERS and getattr(LAUNCHERS.get(name), "__module__", None) == __name__:
        LAUNCHERS.unregister(name)
    LAUNCHERS.register(name, fn)


for _name, _fn in (("dummy", dummy_launcher), ("local", local_launcher),
                   ("multi_gpu", multi_gpu_launcher), ("submitit", submitit_launcher)):
    _register(_name, _fn)
