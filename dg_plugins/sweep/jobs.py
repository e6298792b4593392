"""A sweep's jobs (``domainbed/scripts/sweep.py``): train args in DomainBed's order, identity (the
md5 folder name), command and state on disk; and a launcher's claim on the job folders it queued
(a ``flock``-held file per launcher under ``<sweep>/.launchers/``, under a sweep-wide lock; other
launches and deletes leave them alone) (docs/sweep.md). Torch-free."""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import itertools
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from dg_plugins import catalog, plugins
from dg_plugins.registry import DATASETS
from dg_plugins.seeds import seed_hash
from dg_plugins.sweep import submitit
from dg_plugins.job.flags import EVERY, OPTIONAL, TRAIN_MODULE, names, train_command
from dg_plugins.job.folder import is_done, lock_holder

NOT_LAUNCHED, INCOMPLETE, DONE = "Not launched", "Incomplete", "Done"
#: Incomplete jobs that a live process trains, another live launcher queued, or Slurm holds.
RUNNING, QUEUED, IN_SLURM = "Running", "Queued", "In Slurm"

#: The train flags a sweep may hash into a job's args, and those it passes in every command.
OPTIONAL_TRAIN_ARGS = names(sweep=OPTIONAL) + names(sweep=EVERY, hashed=True)
UNHASHED_TRAIN_ARGS = names(sweep=EVERY, hashed=False)


#: The folder of a sweep that holds its claims and the lock that orders them.
CLAIMS_DIR, SWEEP_LOCK, CLAIM_SUFFIX = ".launchers", "lock", ".claim"

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no claims (as FolderLock: no locking)
    fcntl = None

_counter = itertools.count()


@dataclass
class Claim:
    """A live launcher's claim: who, and the job folders (names in the sweep folder) it holds."""

    pid: int
    host: str
    started: str
    command: str = ""
    jobs: list[str] = field(default_factory=list)
    path: str = ""

    def describe(self) -> str:
        """``launcher pid 123 on host1 (started 2025-01-02 12:03:04)``."""
        return f"launcher pid {self.pid} on {self.host} (started {self.started})"


def claims_dir(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, CLAIMS_DIR)


def sweep_dir_of(output_dir: str) -> str:
    return os.path.dirname(os.path.abspath(output_dir))


def by_sweep(items: Iterable, folder: Callable = lambda item: item) -> dict[str, list]:
    """``items`` (job folders, or jobs with ``folder(item)``) grouped by sweep folder, in order."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(sweep_dir_of(folder(item)), []).append(item)
    return groups


@contextlib.contextmanager
def sweep_lock(sweep_dir: str, exclusive: bool) -> Iterator[bool]:
    """Hold the sweep-wide lock (exclusive to change claims); False when there is none to share."""
    if fcntl is None:
        yield True
        return
    folder = claims_dir(sweep_dir)
    path = os.path.join(folder, SWEEP_LOCK)
    while True:
        try:
            if exclusive:
                os.makedirs(folder, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY, 0o666)
        except FileNotFoundError:
            if exclusive:  # its folder was removed between the two calls: again
                continue
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            current = None
            with contextlib.suppress(FileNotFoundError):
                current = os.stat(path).st_ino
            if current != os.fstat(fd).st_ino:  # removed meanwhile by its holder
                continue
            yield True
            if exclusive and not any(n.endswith(CLAIM_SUFFIX) for n in os.listdir(folder)):
                with contextlib.suppress(OSError):  # still holding the lock
                    os.unlink(path)
                    os.rmdir(folder)
            return
        finally:
            os.close(fd)  # closing releases the lock


def _lock_is_held(path: str) -> bool | None:
    """Whether some process holds ``path``'s flock: True, False, or None when the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), or a file system without flock: count it live
        return True
    finally:
        os.close(fd)
    return False


def read_claims(sweep_dir: str, remove_stale: bool) -> list[Claim]:
    """The live claims in ``sweep_dir`` (stale ones removed when ``remove_stale``)."""
    folder = claims_dir(sweep_dir)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(CLAIM_SUFFIX))
    except OSError:
        return []
    live = []
    for name in names:
        path = os.path.join(folder, name)
        held = _lock_is_held(path)  # None: the file is gone
        if held is False and remove_stale:  # its launcher has died: the kernel dropped its lock
            with contextlib.suppress(OSError):
                os.unlink(path)
        if not held:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError), open(path) as f:
            data = json.load(f)
            live.append(Claim(int(data["pid"]), str(data["host"]), str(data["started"]),
                              str(data.get("command", "")),
                              [str(j) for j in data.get("jobs", [])], path))
    return live


def live_claims(sweep_dir: str) -> list[Claim]:
    """The claims of the live launchers on the sweep in ``sweep_dir`` (creates nothing)."""
    if fcntl is None or not os.path.isdir(claims_dir(sweep_dir)):
        return []
    with sweep_lock(sweep_dir, exclusive=False) as locked:
        return read_claims(sweep_dir, remove_stale=False) if locked else []


def held_folders(claims: Sequence[Claim], sweep_dir: str) -> dict[str, Claim]:
    """Absolute job folder -> the live claim that holds it."""
    return {os.path.abspath(os.path.join(sweep_dir, name)): claim
            for claim in claims for name in claim.jobs}


def held_in(sweep_dir: str) -> dict[str, Claim]:
    return held_folders(live_claims(sweep_dir), sweep_dir)


#: Claims of this process that are open (a launcher releases a job's folder when the job ends).
_ACTIVE: list["LauncherClaim"] = []


class LauncherClaim:
    """This launcher's claim: :meth:`take` jobs nobody holds, :meth:`release` one that ended."""

    def __init__(self, sweep_dir: str, command: str = ""):
        self.sweep_dir = sweep_dir
        self.command = command
        self.fd: int | None = None
        self.path: str | None = None
        self.jobs: list[str] = []
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")

    def __enter__(self) -> "LauncherClaim":
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ValueError):
            _ACTIVE.remove(self)
        if self.fd is None:
            return
        with contextlib.suppress(OSError), sweep_lock(self.sweep_dir, exclusive=True):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None

    def take(self, jobs: Sequence, refresh: Callable[[object, dict], None],
             wanted: Callable[[object], bool], create: Callable[[object], None]
             ) -> tuple[list, list[Claim]]:
        """Claim the jobs still ``wanted``; returns (the jobs kept, the others' live claims)."""
        if fcntl is None:
            for job in jobs:
                create(job)
            return list(jobs), []
        with sweep_lock(self.sweep_dir, exclusive=True):
            others = read_claims(self.sweep_dir, remove_stale=True)
            held = held_folders(others, self.sweep_dir)
            for job in jobs:
                refresh(job, held)
            kept = [job for job in jobs if wanted(job)]
            try:
                for job in kept:
                    create(job)
                    self.jobs.append(os.path.basename(os.path.normpath(job.output_dir)))
            finally:
                if self.jobs:
                    self._write()
        return kept, others

    def release(self, folder: str) -> bool:
        """Stop holding ``folder`` (its job ended); False when this claim did not hold it."""
        name = os.path.basename(os.path.normpath(folder))
        if self.fd is None or name not in self.jobs:
            return False
        with sweep_lock(self.sweep_dir, exclusive=True):
            self.jobs.remove(name)
            self._write()
        return True

    def _write(self) -> None:
        """Write the claim, under the sweep lock (readers never see it half written)."""
        host = socket.gethostname() or "unknown-host"
        if self.fd is None:
            self.path = os.path.join(claims_dir(self.sweep_dir),
                                     f"{host}-{os.getpid()}-{next(_counter)}{CLAIM_SUFFIX}")
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        data = json.dumps({"pid": os.getpid(), "host": host, "started": self.started,
                           "command": self.command, "jobs": self.jobs}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)


def job_ended(folder: str | None) -> None:
    """A launcher's job ended: release its folder from this process's claim."""
    if folder is None:
        return
    for claim in list(_ACTIVE):
        with contextlib.suppress(OSError):
            if claim.release(folder):
                return


def check_dataset_name(dataset: str) -> None:
    """ValueError unless train can run ``dataset`` (a plugin's datasets: once registered)."""
    try:
        catalog.check_dataset_name(dataset)
    except ValueError:
        if not plugins.modules_from_env():
            raise
        plugins.load()
        catalog.check_dataset_name(dataset, extra=DATASETS.list())


def num_environments(dataset: str, data_dir: str | None = None) -> int:
    """Environment count of a dataset: declared, or found in ``data_dir`` for an image folder."""
    if envs := catalog.DATASET_ENVIRONMENTS.get(dataset):
        return len(envs)
    check_dataset_name(dataset)
    if dataset in catalog.IMAGE_FOLDER_DATASETS:
        return len(catalog.environments_of(dataset, data_dir))
    from dg_plugins.datasets import num_environments as registered_environments

    return registered_environments(dataset)


def test_env_combinations(n_envs: int) -> list[list[int]]:
    """DomainBed's combinations: for each i, ``[i]`` then ``[i, j]`` for every j > i."""
    if n_envs < 3:
        raise ValueError(f"test-environment pairs need a dataset with >= 3 environments, got "
                         f"{n_envs}; use --single_test_envs or --single_source")
    return [c for i in range(n_envs) for c in [[i]] + [[i, j] for j in range(i + 1, n_envs)]]


def single_source_test_envs(n_envs: int) -> list[list[int]]:
    """Single-source DG: for each source env (in order), test on every other env."""
    if n_envs < 2:
        raise ValueError(f"single-source jobs need >= 2 environments, got {n_envs}")
    return [[j for j in range(n_envs) if j != source] for source in range(n_envs)]


def test_env_lists(n_envs: int, single_test_envs: bool = False,
                   single_source: bool = False) -> list[list[int]]:
    """The ``test_envs`` of one (dataset, algorithm): pairs (default), singles or complements."""
    if single_test_envs and single_source:
        raise ValueError("--single_test_envs and --single_source are mutually exclusive")
    if single_source:
        return single_source_test_envs(n_envs)
    return [[i] for i in range(n_envs)] if single_test_envs else test_env_combinations(n_envs)


def check_test_env_sets(test_env_sets, n_envs: int, dataset: str) -> list[list[int]]:
    """Explicit ``test_envs`` lists, checked against ``dataset``'s environment count."""
    sets = [[int(e) for e in envs] for envs in test_env_sets]
    for envs in sets:
        if (not envs or any(not 0 <= e < n_envs for e in envs) or len(set(envs)) >= n_envs
                or len(set(envs)) != len(envs)):
            raise ValueError(f"test environment set {envs} does not fit {dataset} ({n_envs} "
                             f"environments, indices 0..{n_envs - 1}; distinct, at least one "
                             "left for training)")
    return sets


def make_args_list(n_trials: int, dataset_names: Sequence[str], algorithms: Sequence[str],
                   n_hparams_from: int, n_hparams: int, steps: int | None, data_dir: str,
                   task: str, holdout_fraction: float, single_test_envs: bool,
                   hparams: str | None, *, single_source: bool = False,
                   checkpoint_freq: int | None = None,
                   uda_holdout_fraction: float | None = None,
                   extra_args: dict | None = None,
                   n_envs: Callable[[str], int] = num_environments,
                   test_env_sets: Sequence[Sequence[int]] | None = None,
                   label_fractions: Sequence[float] | None = None) -> list[dict]:
    """One train-args dict per job in DomainBed's loop order, optional args only when given."""
    optional = {"steps": steps, "hparams": hparams, "checkpoint_freq": checkpoint_freq,
                "uda_holdout_fraction": uda_holdout_fraction, **(extra_args or {})}
    if unknown := set(optional) - set(OPTIONAL_TRAIN_ARGS):
        raise ValueError(f"not pass-through train args: {sorted(unknown)}; known: "
                         f"{', '.join(OPTIONAL_TRAIN_ARGS)}")
    optional = {k: v for k, v in optional.items() if v is not None}
    env_lists = {d: (check_test_env_sets(test_env_sets, n_envs(d), d) if test_env_sets is not None
                     else test_env_lists(n_envs(d), single_test_envs, single_source))
                 for d in dict.fromkeys(dataset_names)}
    return [{"dataset": dataset, "algorithm": algorithm, "test_envs": list(test_envs),
             "holdout_fraction": holdout_fraction, "hparams_seed": hparams_seed,
             "data_dir": data_dir, "task": task, "trial_seed": trial_seed,
             "seed": seed_hash(dataset, algorithm, test_envs, hparams_seed, trial_seed),
             **optional, **({} if fraction is None else {"label_fraction": fraction})}
            for trial_seed, dataset, algorithm in itertools.product(
                range(n_trials), dataset_names, algorithms)
            for test_envs, hparams_seed, fraction in itertools.product(
                env_lists[dataset], range(n_hparams_from, n_hparams),
                [None] if label_fractions is None else label_fractions)]


def job_folder_name(train_args: dict) -> str:
    """md5 hex of ``json.dumps(train_args, sort_keys=True)``, the dict WITHOUT ``output_dir``."""
    return hashlib.md5(json.dumps(train_args, sort_keys=True).encode("utf-8")).hexdigest()


def python_executable() -> str:
    """The interpreter job commands use: this one, quoted."""
    return shlex.quote(sys.executable)


class SweepJob:
    """One training run of a sweep: its folder, command and state on disk (DomainBed's Job)."""

    def __init__(self, train_args: dict, sweep_output_dir: str, module: str = TRAIN_MODULE,
                 python: str | None = None, command_args: dict | None = None,
                 held: dict | None = None):
        self.output_dir = os.path.join(sweep_output_dir, job_folder_name(train_args))
        self.train_args = {**copy.deepcopy(train_args), "output_dir": self.output_dir}
        self.command_args = dict(command_args or {})
        if unknown := set(self.command_args) - set(UNHASHED_TRAIN_ARGS):
            raise ValueError(f"not unhashed train args: {sorted(unknown)}; known: "
                             f"{', '.join(UNHASHED_TRAIN_ARGS)}")
        self.command_str = train_command({**self.train_args, **self.command_args}, module,
                                         python)
        #: The Slurm job recorded in the folder, as Slurm last reported it (None: none).
        self.slurm: submitit.SlurmState | None = None
        self.state = self.refresh_state(held)

    def refresh_state(self, held: dict | None = None) -> str:
        """Done, In Slurm, Running, Queued, Incomplete (folder exists) or Not launched."""
        self.holder = self.launcher = None
        if is_done(self.output_dir):
            self.state = DONE
        elif os.path.exists(self.output_dir):
            self.holder = lock_holder(self.output_dir)
            held = held_in(sweep_dir_of(self.output_dir)) if held is None else held
            self.launcher = held.get(os.path.abspath(self.output_dir))
            in_slurm = self.slurm is not None and self.slurm.held
            self.state = (IN_SLURM if in_slurm else RUNNING if self.holder is not None else
                          QUEUED if self.launcher is not None else INCOMPLETE)
        else:
            self.state = NOT_LAUNCHED
        return self.state

    def command(self, resume: bool = False) -> str:
        return self.command_str + (" --resume" if resume else "")

    def describe(self) -> str:
        """``<output_dir> (dataset, algorithm, test_envs, hparams_seed[, label_fraction F])``."""
        a = self.train_args
        info = (a["dataset"], a["algorithm"], a["test_envs"], a["hparams_seed"])
        if "label_fraction" in a:  # UDG jobs
            info += (f"label_fraction {a['label_fraction']}",)
        return f"{self.output_dir} {info}"

    def __str__(self) -> str:
        return f"{self.state}: {self.describe()}"

    def __repr__(self) -> str:
        return f"SweepJob({self})"


def make_jobs(args_list: Iterable[dict], sweep_output_dir: str, module: str = TRAIN_MODULE,
              python: str | None = None, command_args: dict | None = None) -> list[SweepJob]:
    """One :class:`SweepJob` per train-args dict (``command_args``: in every command, unhashed);
    Slurm is asked once about those whose folder records a Slurm job (no answer: In Slurm)."""
    held = held_in(sweep_output_dir)
    jobs = [SweepJob(args, sweep_output_dir, module, python, command_args, held)
            for args in args_list]
    recorded = {id(job): record["job_id"] for job in jobs if job.state not in (DONE, NOT_LAUNCHED)
                and (record := submitit.recorded_job(job.output_dir)) is not None}
    try:
        states = submitit.job_states(recorded.values())
    except submitit.SlurmError as err:
        states = {i: submitit.SlurmState(i, "UNKNOWN", f"Slurm did not answer: {err}", held=True)
                  for i in recorded.values()}
    for job in jobs:
        if (job_id := recorded.get(id(job))) is not None:  # an id Slurm no longer knows: ended
            job.slurm = states.get(job_id, submitit.SlurmState(job_id, "ENDED"))
            job.refresh_state(held)
    return jobs


def summary_line(jobs: Sequence[SweepJob]) -> str:
    """DomainBed's ``<N> jobs: <d> done, <i> incomplete, <n> not launched.``, plus the others."""
    counts = collections.Counter(job.state for job in jobs)
    others = "".join(f"{counts[state]} {what}, " for state, what in (
        (RUNNING, "running"), (QUEUED, "queued by another launcher"),
        (IN_SLURM, "held by Slurm")) if counts[state])
    return (f"{len(jobs)} jobs: {counts[DONE]} done, {counts[INCOMPLETE]} incomplete, "
            f"{others}{counts[NOT_LAUNCHED]} not launched.")


def launcher_note(jobs: Sequence[SweepJob], action: str) -> list[str]:
    """Lines naming each other live launcher that holds (Queued) jobs, left to it by ``action``."""
    by_claim: dict[str, tuple[Claim, list[SweepJob]]] = {}
    for job in jobs:
        if job.state == QUEUED:
            by_claim.setdefault(job.launcher.path, (job.launcher, []))[1].append(job)
    what = "not launched here" if action == "launch" else "not deleted"
    lines = [f"Note: another sweep launcher is working on this sweep: {claim.describe()} holds "
             f"{len(claim.jobs)} of its jobs; {len(queued)} of them are queued (folder created, "
             f"not started yet): {what}." for claim, queued in by_claim.values()]
    if lines:
        lines.append("  That launcher runs them and reports them when it ends; this launch runs "
                     "only the jobs no live launcher holds. Once it has ended, launch again "
                     "(with --resume) to continue any that did not finish." if action == "launch"
                     else "  A live launcher's queued folders are never deleted; once it has "
                     "ended, those that did not finish are Incomplete.")
    return lines


def left_alone_notes(jobs: Sequence[SweepJob], action: str) -> list[str]:
    """Lines naming the Running jobs, those another launcher queued (:func:`launcher_note`) and
    those Slurm holds (and how to cancel them), each left alone by ``action``."""
    running = [job for job in jobs if job.state == RUNNING]
    held = [job for job in jobs if job.state == IN_SLURM]
    launching = action == "launch"
    what = "not relaunched and not waited for" if launching else "not deleted"
    lines = [f"Note: {len(running)} job(s) are still running (a live process holds their "
             f"folder's lock): left alone, {what}:",
             *(f"  running (pid {job.holder}): {job.describe()}" for job in running),
             "  Once they have ended, relaunch with --resume to continue any that did not "
             "finish."] if running else []
    lines += launcher_note(jobs, action)
    return lines + ([
        f"Note: {len(held)} job(s) are held by Slurm (queued, running or requeued): "
        f"{'not submitted again' if launching else 'not deleted'}:",
        *(f"  {job.slurm.describe()}: {job.describe()}" for job in held),
        "  Slurm runs them (and requeues them after preemption or a time limit); to stop "
        "them, run this command with the action 'cancel' (or scancel "
        + " ".join(sorted({job.slurm.job_id.split('_')[0] for job in held})) + ")."]
        if held else [])


#: The states each action applies to (never a Running, Queued or In Slurm job).
ACTION_STATES = {"launch": {NOT_LAUNCHED}, "delete_incomplete": {INCOMPLETE},
                 "delete_all": {INCOMPLETE, DONE}}


def select_jobs(jobs: Sequence[SweepJob], action: str, resume: bool = False) -> list[SweepJob]:
    """The jobs an action applies to (with ``resume``, launch takes Incomplete ones too)."""
    if action not in ACTION_STATES:
        raise ValueError(f"unknown sweep action {action!r}; choices: {', '.join(ACTION_STATES)}")
    wanted = ACTION_STATES[action] | ({INCOMPLETE} if resume and action == "launch" else set())
    return [job for job in jobs if job.state in wanted]
