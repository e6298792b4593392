"""A sweep's jobs (``domainbed/scripts/sweep.py``): their train args in DomainBed's order, their
identity (the md5 folder name), command and state on disk (docs/sweep.md). Torch-free."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shlex
import sys
from typing import Callable, Iterable, Sequence

from dg_plugins import catalog
from dg_plugins.seeds import seed_hash
from dg_plugins.sweep import claims, slurm
from dg_plugins.job.flags import EVERY, OPTIONAL, TRAIN_MODULE, names
from dg_plugins.job.folder import is_done, lock_holder

NOT_LAUNCHED = "Not launched"
INCOMPLETE = "Incomplete"
DONE = "Done"
#: An Incomplete job whose folder lock is held by a live process (it is still training).
RUNNING = "Running"
#: An Incomplete job that another live launcher has queued (:mod:`dg_plugins.sweep.claims`).
QUEUED = "Queued"
#: An Incomplete job whose recorded Slurm job Slurm still holds: queued, running or requeued
#: (:mod:`dg_plugins.sweep.slurm`).
IN_SLURM = "In Slurm"

#: The train flags a sweep may put in a job's hashed args besides those it enumerates: its own
#: flags of the same name when given, and those it passes to every job
#: (:data:`dg_plugins.job.flags.FLAGS`' policies).
OPTIONAL_TRAIN_ARGS = names(sweep=OPTIONAL) + names(sweep=EVERY, hashed=True)
#: Train flags a sweep passes in every job's command but not in its hashed args (``eval_splits``,
#: ``n_workers``): the tables are the same either way, so a job keeps DomainBed's folder name; a
#: job started with one ``eval_splits`` and resumed with the other is refused by train, and before
#: that by the sweep's check (:func:`dg_plugins.sweep.checks.eval_splits_problems`).
UNHASHED_TRAIN_ARGS = names(sweep=EVERY, hashed=False)


# --------------------------------------------------------------------------------------------
# Names and defaults


def check_dataset_name(dataset: str) -> None:
    """Raise ValueError ("did you mean", or the bridge for DomainBed-only datasets) unless train
    can run ``dataset`` (the catalog's check)."""
    try:
        catalog.check_dataset_name(dataset)
    except ValueError:
        from dg_plugins import plugins

        if not plugins.modules_from_env():
            raise
        plugins.load()  # a plugin's datasets declare themselves when registered
        from dg_plugins.registry import DATASETS

        catalog.check_dataset_name(dataset, extra=DATASETS.list())


def num_environments(dataset: str, data_dir: str | None = None) -> int:
    """Environment count of a dataset: declared, or found in ``data_dir`` for an image folder
    without fixed ones."""
    check_dataset_name(dataset)
    envs = catalog.DATASET_ENVIRONMENTS.get(dataset)
    if envs:
        return len(envs)
    if dataset in catalog.IMAGE_FOLDER_DATASETS:
        return len(catalog.environments_of(dataset, data_dir))
    from dg_plugins.datasets import num_environments as registered_environments

    return registered_environments(dataset)



def default_datasets() -> list[str]:
    """DomainBed's ``--datasets`` default: every catalog dataset whose name lacks "Debug"."""
    return [name for name in catalog.DATASET_ENVIRONMENTS if "Debug" not in name]


def default_algorithms() -> list[str]:
    """Every algorithm registered in dg_plugins, plugins of ``$DG_PLUGINS_IMPORT`` included
    (imports dg_plugins.algorithms, hence torch)."""
    from dg_plugins import plugins
    from dg_plugins.registry import ALGORITHMS

    plugins.load()
    return ALGORITHMS.list()



# --------------------------------------------------------------------------------------------
# Enumeration (``sweep.make_args_list``)


def test_env_combinations(n_envs: int) -> list[list[int]]:
    """DomainBed's combinations: for each i, ``[i]`` then ``[i, j]`` for every j > i."""
    if n_envs < 3:
        raise ValueError(
            f"test-environment pairs need a dataset with >= 3 environments, got {n_envs}; "
            "use --single_test_envs or --single_source"
        )
    combos = []
    for i in range(n_envs):
        combos.append([i])
        combos.extend([i, j] for j in range(i + 1, n_envs))
    return combos


def single_source_test_envs(n_envs: int) -> list[list[int]]:
    """Single-source DG: for each source env s (in order), test on every other env."""
    if n_envs < 2:
        raise ValueError(f"single-source jobs need >= 2 environments, got {n_envs}")
    return [[j for j in range(n_envs) if j != source] for source in range(n_envs)]


def test_env_lists(n_envs: int, single_test_envs: bool = False,
                   single_source: bool = False) -> list[list[int]]:
    """The ``test_envs`` values of one (dataset, algorithm): pairs (default), singles or
    single-source complements."""
    if single_test_envs and single_source:
        raise ValueError("--single_test_envs and --single_source are mutually exclusive")
    if single_source:
        return single_source_test_envs(n_envs)
    if single_test_envs:
        return [[i] for i in range(n_envs)]
    return test_env_combinations(n_envs)


def check_test_env_sets(test_env_sets, n_envs: int, dataset: str) -> list[list[int]]:
    """Explicit ``test_envs`` lists, checked against ``dataset``'s environment count."""
    sets = []
    for envs in test_env_sets:
        envs = [int(e) for e in envs]
        bad = [e for e in envs if not 0 <= e < n_envs]
        if not envs or bad or len(set(envs)) >= n_envs or len(set(envs)) != len(envs):
            raise ValueError(f"test environment set {envs} does not fit {dataset} ({n_envs} "
                             f"environments, indices 0..{n_envs - 1}; distinct, at least one "
                             "left for training)")
        sets.append(envs)
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
    """One train-args dict per job, in DomainBed's loop order (``sweep.make_args_list``),
    optional args only when given (docs/sweep.md)."""
    optional = {"steps": steps, "hparams": hparams, "checkpoint_freq": checkpoint_freq,
                "uda_holdout_fraction": uda_holdout_fraction, **(extra_args or {})}
    unknown = set(optional) - set(OPTIONAL_TRAIN_ARGS)
    if unknown:
        raise ValueError(f"not pass-through train args: {sorted(unknown)}; known: "
                         f"{', '.join(OPTIONAL_TRAIN_ARGS)}")
    if test_env_sets is not None:
        env_lists = {d: check_test_env_sets(test_env_sets, n_envs(d), d)
                     for d in dict.fromkeys(dataset_names)}
    else:
        env_lists = {d: test_env_lists(n_envs(d), single_test_envs, single_source)
                     for d in dict.fromkeys(dataset_names)}
    fractions = [None] if label_fractions is None else list(label_fractions)
    args_list = []
    for trial_seed in range(n_trials):
        for dataset in dataset_names:
            for algorithm in algorithms:
                for test_envs in env_lists[dataset]:
                    for hparams_seed in range(n_hparams_from, n_hparams):
                        train_args = {
                            "dataset": dataset,
                            "algorithm": algorithm,
                            "test_envs": list(test_envs),
                            "holdout_fraction": holdout_fraction,
                            "hparams_seed": hparams_seed,
                            "data_dir": data_dir,
                            "task": task,
                            "trial_seed": trial_seed,
                            "seed": seed_hash(dataset, algorithm, test_envs, hparams_seed,
                                              trial_seed),
                        }
                        train_args.update({k: v for k, v in optional.items() if v is not None})
                        for fraction in fractions:
                            job_args = dict(train_args)
                            if fraction is not None:
                                job_args["label_fraction"] = fraction
                            args_list.append(job_args)
    return args_list


# --------------------------------------------------------------------------------------------
# Identity and commands


def job_folder_name(train_args: dict) -> str:
    """md5 hex of ``json.dumps(train_args, sort_keys=True)``, the dict WITHOUT ``output_dir``."""
    return hashlib.md5(json.dumps(train_args, sort_keys=True).encode("utf-8")).hexdigest()


def format_flag_value(value) -> str:
    """Lists: space-joined ``str`` of the items; strings: ``shlex.quote``; others: ``str``."""
    if isinstance(value, list):
        return " ".join(str(item) for item in value)
    if isinstance(value, str):
        return shlex.quote(value)
    return str(value)


def python_executable() -> str:
    """The interpreter job commands use: this one, quoted. DomainBed uses the bare word
    ``python`` from PATH, which picks a wrong interpreter when the venv is not activated."""
    return shlex.quote(sys.executable)


def build_command(args: dict, module: str = TRAIN_MODULE, python: str | None = None) -> str:
    """``<python> -m <module> --key value ...`` (sorted keys), as DomainBed's ``sweep.Job``."""
    parts = [python or python_executable(), "-m", module]
    parts += [f"--{key} {format_flag_value(value)}" for key, value in sorted(args.items())]
    return " ".join(parts)


class SweepJob:
    """One training run of a sweep: its folder, command and on-disk state (DomainBed's
    ``sweep.Job``)."""

    NOT_LAUNCHED = NOT_LAUNCHED
    INCOMPLETE = INCOMPLETE
    DONE = DONE
    RUNNING = RUNNING
    QUEUED = QUEUED
    IN_SLURM = IN_SLURM

    def __init__(self, train_args: dict, sweep_output_dir: str, module: str = TRAIN_MODULE,
                 python: str | None = None, command_args: dict | None = None,
                 held: dict | None = None):
        self.output_dir = os.path.join(sweep_output_dir, job_folder_name(train_args))
        self.train_args = copy.deepcopy(train_args)
        self.train_args["output_dir"] = self.output_dir
        #: Flags of the command that are not hashed (:data:`UNHASHED_TRAIN_ARGS`).
        self.command_args = dict(command_args or {})
        unknown = set(self.command_args) - set(UNHASHED_TRAIN_ARGS)
        if unknown:
            raise ValueError(f"not unhashed train args: {sorted(unknown)}; known: "
                             f"{', '.join(UNHASHED_TRAIN_ARGS)}")
        self.command_str = build_command({**self.train_args, **self.command_args}, module,
                                         python)
        #: The Slurm job recorded in the folder, as Slurm last reported it (None: none).
        self.slurm: slurm.SlurmState | None = None
        self.state = self.refresh_state(held)

    def refresh_state(self, held: dict | None = None) -> str:
        """Done, Running (lock held), In Slurm (its Slurm job is still held by Slurm), Queued (a
        live launcher's claim), Incomplete (folder exists) or Not launched."""
        self.holder = None
        self.launcher = None
        if is_done(self.output_dir):
            self.state = DONE
        elif os.path.exists(self.output_dir):
            self.holder = lock_holder(self.output_dir)
            if held is None:
                held = claims.held_in(os.path.dirname(os.path.abspath(self.output_dir)))
            self.launcher = held.get(os.path.abspath(self.output_dir))
            in_slurm = self.slurm is not None and self.slurm.held
            self.state = (IN_SLURM if in_slurm else RUNNING if self.holder is not None else
                          QUEUED if self.launcher is not None else INCOMPLETE)
        else:
            self.state = NOT_LAUNCHED
        return self.state

    def command(self, resume: bool = False) -> str:
        """The command string; with ``resume``, ``--resume`` appended (train then continues from
        the last checkpoint in output_dir)."""
        return self.command_str + (" --resume" if resume else "")

    def describe(self) -> str:
        """``<output_dir> (dataset, algorithm, test_envs, hparams_seed)``."""
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
    """One :class:`SweepJob` per train-args dict; ``command_args`` go in every command, unhashed
    (:data:`UNHASHED_TRAIN_ARGS`). The live launchers' claims are read once."""
    held = claims.held_in(sweep_output_dir)
    jobs = [SweepJob(args, sweep_output_dir, module, python, command_args, held)
            for args in args_list]
    ask_slurm(jobs, held)
    return jobs


def ask_slurm(jobs: Sequence[SweepJob], held: dict | None = None) -> None:
    """Ask Slurm, once, about the jobs whose folder records a Slurm job; when it does not answer,
    such jobs count as In Slurm (never resubmitted or deleted) and say why."""
    recorded = {}
    for job in jobs:
        if job.state not in (DONE, NOT_LAUNCHED):
            record = slurm.recorded_job(job.output_dir)
            if record is not None:
                recorded[id(job)] = record["job_id"]
    if not recorded:
        return
    try:
        states = slurm.job_states(recorded.values())
    except slurm.SlurmError as err:
        states = {i: slurm.SlurmState(i, "UNKNOWN", f"Slurm did not answer: {err}", held=True)
                  for i in recorded.values()}
    for job in jobs:
        job_id = recorded.get(id(job))
        if job_id is not None:  # an id squeue and sacct no longer know has ended
            job.slurm = states.get(job_id, slurm.SlurmState(job_id, "ENDED"))
            job.refresh_state(held)


def summary_line(jobs: Sequence[SweepJob]) -> str:
    """``"<N> jobs: <d> done, <i> incomplete, <n> not launched."`` (DomainBed's), with running
    and queued counts when some."""
    counts = {state: sum(job.state == state for job in jobs)
              for state in (DONE, INCOMPLETE, RUNNING, QUEUED, IN_SLURM, NOT_LAUNCHED)}
    running = f"{counts[RUNNING]} running, " if counts[RUNNING] else ""
    queued = f"{counts[QUEUED]} queued by another launcher, " if counts[QUEUED] else ""
    in_slurm = f"{counts[IN_SLURM]} held by Slurm, " if counts[IN_SLURM] else ""
    return (f"{len(jobs)} jobs: {counts[DONE]} done, {counts[INCOMPLETE]} incomplete, "
            f"{running}{queued}{in_slurm}{counts[NOT_LAUNCHED]} not launched.")


def launcher_note(jobs: Sequence[SweepJob], action: str) -> list[str]:
    """Lines naming each other live launcher that holds jobs of ``jobs`` (Queued, or Running
    under it), how many, and that ``action`` leaves them to it (empty when none)."""
    by_claim: dict[str, tuple[claims.Claim, list[SweepJob]]] = {}
    for job in jobs:
        if job.state == QUEUED:
            by_claim.setdefault(job.launcher.path, (job.launcher, []))[1].append(job)
    if not by_claim:
        return []
    what = {"launch": "not launched here", "delete_incomplete": "not deleted",
            "delete_all": "not deleted"}[action]
    lines = []
    for claim, queued in by_claim.values():
        lines.append(f"Note: another sweep launcher is working on this sweep: {claim.describe()}"
                     f" holds {len(claim.jobs)} of its jobs; {len(queued)} of them are queued "
                     f"(folder created, not started yet): {what}.")
    if action == "launch":
        lines.append("  That launcher runs them and reports them when it ends; this launch runs "
                     "only the jobs no live launcher holds. Once it has ended, launch again "
                     "(with --resume) to continue any that did not finish.")
    else:
        lines.append("  A live launcher's queued folders are never deleted; once it has ended, "
                     "those that did not finish are Incomplete.")
    return lines


def running_note(jobs: Sequence[SweepJob], action: str) -> list[str]:
    """Lines saying that the Running jobs are left alone by ``action`` (empty when none)."""
    running = [job for job in jobs if job.state == RUNNING]
    if not running:
        return []
    what = {"launch": "not relaunched and not waited for",
            "delete_incomplete": "not deleted", "delete_all": "not deleted"}[action]
    lines = [f"Note: {len(running)} job(s) are still running (a live process holds their "
             f"folder's lock): left alone, {what}:"]
    lines += [f"  running (pid {job.holder}): {job.describe()}" for job in running]
    lines.append("  Once they have ended, relaunch with --resume to continue any that did not "
                 "finish.")
    return lines



def slurm_note(jobs: Sequence[SweepJob], action: str) -> list[str]:
    """Lines naming the jobs Slurm still holds (queued, running or requeued), with their ids,
    that ``action`` leaves them alone, and how to cancel them (empty when none)."""
    held = [job for job in jobs if job.state == IN_SLURM]
    if not held:
        return []
    what = {"launch": "not submitted again", "delete_incomplete": "not deleted",
            "delete_all": "not deleted"}.get(action, "left alone")
    lines = [f"Note: {len(held)} job(s) are held by Slurm (queued, running or requeued): "
             f"{what}:"]
    lines += [f"  {job.slurm.describe()}: {job.describe()}" for job in held]
    lines.append("  Slurm runs them (and requeues them after preemption or a time limit); to "
                 "stop them, run this command with the action 'cancel' (or scancel "
                 + " ".join(sorted({job.slurm.job_id.split('_')[0] for job in held})) + ").")
    return lines


def select_jobs(jobs: Sequence[SweepJob], action: str, resume: bool = False) -> list[SweepJob]:
    """The jobs an action applies to; never a Running, Queued or In Slurm one."""
    if action == "launch":
        wanted = {NOT_LAUNCHED, INCOMPLETE} if resume else {NOT_LAUNCHED}
    elif action == "delete_incomplete":
        wanted = {INCOMPLETE}
    elif action == "delete_all":
        wanted = {INCOMPLETE, DONE}
    else:
        raise ValueError(f"unknown sweep action {action!r}; choices: launch, delete_incomplete, "
                         "delete_all")
    return [job for job in jobs if job.state in wanted]

