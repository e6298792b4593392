"""``python -m dg_plugins.scripts.reproduce SETTING [--protocol release|domainbed] ...``: run one
paper setting of :mod:`dg_plugins.reference.paper_settings` (its sweeps, then its tables beside
the paper's rows).

    python -m dg_plugins.scripts.reproduce --list                      # settings, jobs, steps
    python -m dg_plugins.scripts.reproduce --list --forwards           # forwards, GPU-hours
    python -m dg_plugins.scripts.reproduce dmg_pacs --describe         # every value + source
    python -m dg_plugins.scripts.reproduce dmg_pacs --protocol release --data_dir D \\
        --output_dir O --command_launcher multi_gpu [--dry_run] [extra sweep flags]

The setting's table becomes ``sweep launch`` calls (one per backbone folder, algorithm group,
dataset, and for epoch-based settings per held-out environment, whose steps follow from its
sources' image counts: :func:`dg_plugins.reference.paper_settings.steps_per_epoch`), run in this
process with ``--resume`` (a rerun continues where a run stopped) and ``--skip_confirmation``;
then ``collect_results`` prints each folder's tables with the setting's model selection and
``--paper`` rows. IP/OOP settings first score their datasets (``alignment_scores``, with the
table's CLIP model and split rule; ``--clip_checkpoint FILE``: a local copy of its weights).

Before anything starts, every sweep call's jobs are checked at once (:func:`prerequisites`): the
data folder, each dataset's files, PACS's official split lists where ``data_split`` is
"official", the CLIP weights of scores still to compute, the pretrained weights of every backbone
and a writable output folder. Each missing piece is printed with its fix; then nothing is launched
or written (exit 2).

``--dry_run`` launches and writes nothing: it prints every call, its jobs and commands, the
number of jobs and the total steps (with where the image counts behind epoch-derived steps come
from: the data under ``--data_dir`` when it is there, PACS's official lists there too, else the
counts recorded in the table), each job's image forwards of training and of evaluation with
``--eval_splits selection`` and ``all`` and their sums per call and in total (the GPU cost
before launch: :data:`FORWARDS_DEFINITION`, :func:`job_forwards`), the estimated GPU-hours per
call and in total, with the device whose measured step times they come from
(:func:`job_gpu_time`, :mod:`dg_plugins.reference.gpu_times`), the ``collect_results``
commands, and last the missing prerequisites as warnings. Extra arguments are sweep flags passed to every call
(``--n_trials 1``, ``--n_hparams 20``, ``--slurm_*`` ...); flags the table sets (steps, datasets,
test environments, splits, ...) are refused, except ``--datasets`` / ``--algorithms`` /
``--test_envs``, which pick a subset of the setting's datasets, algorithms and
test-environment sets, ``--hparams``, whose JSON is added to every run's hparams, ``--epochs`` /
``--pretrain_epochs``, which replace an epoch-based setting's lengths, and ``--steps``, which
replaces a step-based setting's (each replacement is printed as a note and recorded).

Every job evaluates only the splits model selection reads (``--eval_splits selection``, the
default here: the same tables for less evaluation); ``--eval_splits all`` (sweeps/*.sh:
``EVAL_SPLITS=all``) evaluates every split at every record, for full learning curves.

``--dry_run_sweeps launch FLAGS [:: launch FLAGS ...]`` does the same listing (jobs, count, total
steps, image forwards, GPU-hours) for plain sweep calls: the ``DRY_RUN=1`` mode of the offline
scripts in ``sweeps/``. ``--list --forwards`` prints the image forwards and GPU-hours of every
setting and protocol from the recorded full-size image counts (or those under ``--data_dir``).

Exit status: 0; 2 on bad input (a one-line message naming the fix); otherwise the first non-zero
status of a sweep call (128 + signal when one was stopped: the rest is not started).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field

from dg_plugins import catalog
from dg_plugins.reference import paper_settings as ps

#: Sweep flags a setting's table owns (a changed value would run another protocol).
OWNED_SWEEP_FLAGS = ("task", "steps", "holdout_fraction", "single_test_envs", "single_source",
                     "checkpoint_freq", "uda_holdout_fraction", "alignment_scores",
                     "alignment_threshold", "alignment_preset", "test_env_sets",
                     "label_fractions", "pretrain_steps", "n_hparams_from")
#: The separator of sweep calls after --dry_run_sweeps.
CALL_SEPARATOR = "::"


class UsageError(ValueError):
    """Bad input: printed as one line, exit status 2."""


# --------------------------------------------------------------------------------------------
# Image counts


@dataclass(frozen=True)
class Sizes:
    """Images per environment of a dataset and where the counts come from."""
    counts: tuple[int, ...]
    source: str


_SIZES_CACHE: dict[tuple[str, str | None], Sizes] = {}


def dataset_sizes(dataset: str, data_dir: str | None) -> Sizes:
    """Images per environment of ``dataset``: counted in ``data_dir`` when the dataset's folder
    is there (every image of its domain folders; DomainNet20: of its 20 classes); for a built-in
    dataset (no files: ``--data_dir builtin``) its own sizes (:func:`_built_in`); else the counts
    recorded in :data:`~dg_plugins.reference.paper_settings.DATASET_SIZES`; none of these raises
    :class:`UsageError`."""
    key = (dataset, data_dir)
    if key not in _SIZES_CACHE:
        _SIZES_CACHE[key] = (_count_on_disk(dataset, data_dir) or _built_in(dataset, data_dir)
                             or _recorded(dataset, data_dir))
    return _SIZES_CACHE[key]


def _built_in(dataset: str, data_dir: str | None) -> Sizes | None:
    """Images per environment of an in-memory dataset that needs no files: DigitsOffline's
    generator sizes (nothing is generated), or, under ``--data_dir builtin``, the environments of
    the dataset built in this process (RotatedMNIST5k, Debug28: a fraction of a second, nothing
    written); None for any other dataset."""
    import dg_plugins.datasets  # noqa: F401  (registers the datasets)
    from dg_plugins.registry import DATASETS

    if dataset not in DATASETS or not getattr(DATASETS.get(dataset), "IN_MEMORY", False):
        return None
    if dataset == "DigitsOffline":
        from dg_plugins.datasets import digits_offline

        return Sizes(tuple(digits_offline.SIZES[d] for d in digits_offline.ENVIRONMENTS),
                     "DigitsOffline's generator sizes (dg_plugins/datasets/digits_offline.py "
                     "SIZES)")
    if data_dir != "builtin":
        return None
    try:
        built = DATASETS.get(dataset)(data_dir, [], {})
    except (OSError, ValueError, ImportError):
        return None
    return Sizes(tuple(len(env) for env in built), f"counted in the built-in {dataset}")


def _dataset_folder(dataset: str, data_dir: str | None) -> str | None:
    if data_dir is None:
        return None
    import dg_plugins.datasets  # noqa: F401  (registers the datasets)
    from dg_plugins.registry import DATASETS

    if dataset not in DATASETS:
        return None
    folder = getattr(DATASETS.get(dataset), "FOLDER_NAME", None)
    return os.path.join(data_dir, folder) if folder else None


def _count_on_disk(dataset: str, data_dir: str | None) -> Sizes | None:
    root = _dataset_folder(dataset, data_dir)
    if root is None or not os.path.isdir(root):
        return None
    from dg_plugins.datasets.image_folder import list_images, visible_subfolders

    envs = visible_subfolders(root)
    expected = catalog.DATASET_ENVIRONMENTS.get(dataset)
    if expected is not None and len(envs) != len(expected):
        raise UsageError(f"{root} holds {len(envs)} domain folders ({', '.join(envs)}), {dataset} "
                         f"has {len(expected)}: fix the folder or pass another --data_dir")
    classes = None
    if dataset == "DomainNet20":
        from dg_plugins.datasets.domainnet20 import CLASSES as classes
    counts = []
    for env in envs:
        env_root = os.path.join(root, env)
        names = visible_subfolders(env_root) if classes is None else \
            [c for c in visible_subfolders(env_root) if c in set(classes)]
        counts.append(sum(len(list_images(os.path.join(env_root, c))) for c in names))
    return Sizes(tuple(counts), f"counted on disk in {root}")


def _recorded(dataset: str, data_dir: str | None) -> Sizes:
    recorded = ps.DATASET_SIZES.get(dataset)
    where = _dataset_folder(dataset, data_dir) or (data_dir or "no --data_dir")
    if recorded is None:
        raise UsageError(f"no image counts of {dataset}: no data in {where} and none recorded "
                         "in dg_plugins/reference/paper_settings.py (DATASET_SIZES)")
    return Sizes(tuple(recorded.value), f"recorded counts ({where} not found): {recorded.source}")


#: The official split lists a dataset with ``data_split: "official"`` reads, by kind.
OFFICIAL_LIST_KINDS = ("train", "crossval", "test")


def official_list_sizes(dataset: str, data_dir: str | None) -> tuple[dict, str]:
    """``({kind: images per environment}, origin)`` of the official ``<domain>_<kind>_kfold.txt``
    lists (train, crossval, test) of ``dataset``: counted (their non-empty lines, as the dataset
    reads them) when every domain's lists are under ``data_dir``'s dataset folder, else the
    recorded sizes (:data:`~dg_plugins.reference.paper_settings.OFFICIAL_TRAIN_SIZES`,
    ``OFFICIAL_VAL_SIZES``; a test list is the whole domain, ``DATASET_SIZES``)."""
    root = _dataset_folder(dataset, data_dir)
    if root is not None and os.path.isdir(root):
        from dg_plugins.datasets.image_folder import visible_subfolders

        counts: dict[str, list[int]] = {kind: [] for kind in OFFICIAL_LIST_KINDS}
        envs = visible_subfolders(root)
        paths = [(kind, os.path.join(root, f"{env}_{kind}_kfold.txt")) for env in envs
                 for kind in OFFICIAL_LIST_KINDS]
        if envs and all(os.path.isfile(path) for _, path in paths):
            for kind, path in paths:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    counts[kind].append(sum(1 for line in handle if line.strip()))
            return ({kind: tuple(v) for kind, v in counts.items()},
                    f"official split lists counted in {root}")
    train, val = ps.OFFICIAL_TRAIN_SIZES.get(dataset), ps.OFFICIAL_VAL_SIZES.get(dataset)
    whole = ps.DATASET_SIZES.get(dataset)
    if train is None or val is None or whole is None:
        raise UsageError(f"no official split sizes recorded for {dataset}")
    return ({"train": tuple(train.value), "crossval": tuple(val.value),
             "test": tuple(whole.value)}, f"official split lists: {train.source}")


def training_in_sizes(dataset: str, sources: list[int], hparams: dict, holdout: float,
                      data_dir: str | None) -> tuple[list[int], str]:
    """The training in-split size of each source environment, and where it comes from: under
    ``data_split: "official"`` the official train lists (:func:`official_list_sizes`), else
    DomainBed's random holdout of the environment's images."""
    if hparams.get("data_split") == "official":
        lists, origin = official_list_sizes(dataset, data_dir)
        return [lists["train"][e] for e in sources], origin
    sizes = dataset_sizes(dataset, data_dir)
    return ([ps.in_split_size(sizes.counts[e], holdout) for e in sources],
            f"{sizes.source}; in-split = images - int(images x {holdout:g})")


# --------------------------------------------------------------------------------------------
# Planning a setting


@dataclass
class SweepCall:
    """One ``sweep launch`` call of a setting."""
    argv: list[str]
    label: str
    folder: str


@dataclass
class Plan:
    setting: ps.Setting
    protocol: ps.Protocol
    prepare: list[list[str]] = field(default_factory=list)  # alignment_scores argv lists
    calls: list[SweepCall] = field(default_factory=list)
    collects: list[list[str]] = field(default_factory=list)  # collect_results argv lists
    notes: list[str] = field(default_factory=list)
    root: str = ""  # the protocol's output folder
    argv: list[str] = field(default_factory=list)  # reproduce's arguments (for the record)


def _flag_values(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _test_env_sets(protocol: ps.Protocol, dataset: str) -> list[list[int]]:
    """Every test-environment set of ``protocol`` on ``dataset``, in the sweep's order."""
    spec = protocol.test_envs.value
    n_envs = len(catalog.DATASET_ENVIRONMENTS[dataset])
    if spec == "single_test_envs":
        return [[i] for i in range(n_envs)]
    if spec == "single_source":
        return [[e for e in range(n_envs) if e != i] for i in range(n_envs)]
    return [list(s) for s in spec]


def parse_test_env_sets(texts: list[str]) -> list[list[int]]:
    """``["0", "1,2,3"]`` -> ``[[0], [1, 2, 3]]`` (the ``--test_envs`` / TEST_ENVS knob)."""
    try:
        return [sorted({int(e) for e in text.split(",") if e.strip()}) for text in texts]
    except ValueError:
        raise UsageError(f"--test_envs takes test-environment sets such as 0 or 1,2,3 (comma-"
                         f"separated indices); got {' '.join(texts)}") from None


def _pick_test_env_sets(protocol: ps.Protocol, dataset: str, wanted, setting: str):
    available = _test_env_sets(protocol, dataset)
    if wanted is None:
        return available
    unknown = [w for w in wanted if sorted(w) not in [sorted(a) for a in available]]
    if unknown:
        def text(sets):
            return " ".join(",".join(map(str, s)) for s in sets)
        raise UsageError(f"--test_envs {text(unknown)}: not among {setting}'s test-environment "
                         f"sets on {dataset} ({text(available)}); give a subset of them")
    return [a for a in available if sorted(a) in [sorted(w) for w in wanted]]


def _pick(kind: str, wanted: list[str] | None, available: list[str], setting: str) -> list[str]:
    if wanted is None:
        return available
    unknown = [w for w in wanted if w not in available]
    if unknown:
        raise UsageError(f"--{kind} {' '.join(unknown)}: not in {setting}'s {kind} "
                         f"({', '.join(available)}); give a subset of them")
    return [a for a in available if a in wanted]


def plan_setting(setting: ps.Setting, protocol: ps.Protocol, *, data_dir: str,
                 output_dir: str, launcher: str | None = None, datasets=None, algorithms=None,
                 epochs: float | None = None, pretrain_epochs: float | None = None,
                 steps: int | None = None, test_envs: list[list[int]] | None = None,
                 clip_checkpoint: str | None = None, hparams: dict | None = None,
                 extra: list[str] = (), count_dir: str | None = None,
                 eval_splits: str = "selection") -> Plan:
    """The sweep calls, scoring commands and tables of one protocol (see the module docstring).
    ``count_dir``: where image counts are looked for (default ``data_dir``); ``eval_splits``:
    every job's ``--eval_splits``."""
    count_dir = data_dir if count_dir is None else count_dir
    plan = Plan(setting, protocol)
    all_datasets = list(protocol.datasets.value)
    use_datasets = _pick("datasets", datasets, all_datasets, setting.name)
    all_algorithms = list(dict.fromkeys(a for run in protocol.runs for a in run.algorithms))
    use_algorithms = _pick("algorithms", algorithms, all_algorithms, setting.name)
    sweep_flags = {k: v.value for k, v in protocol.sweep_flags.items()}
    n_epochs = protocol.epochs.value if protocol.epochs is not None else None
    for flag, knob, value in (("epochs", "EPOCHS", epochs),
                              ("pretrain_epochs", "PRETRAIN_EPOCHS", pretrain_epochs)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"--{flag} ({knob}) must be a positive number of epochs, got "
                             f"{value:g}")
    if epochs is not None:
        if n_epochs is not None:
            n_epochs = epochs
        elif "udg_ft_epochs" in sweep_flags:
            sweep_flags["udg_ft_epochs"] = epochs
        else:
            raise UsageError(f"--epochs: {setting.name} ({protocol.name}) is not epoch-based; its "
                             "lengths are steps")
        plan.notes.append(f"--epochs {epochs:g} replaces the table's length")
    if pretrain_epochs is not None:
        if "udg_pretrain_epochs" not in sweep_flags:
            raise UsageError(f"--pretrain_epochs: {setting.name} has no pretraining")
        sweep_flags["udg_pretrain_epochs"] = pretrain_epochs
        plan.notes.append(f"--pretrain_epochs {pretrain_epochs:g} replaces the table's length")
    if steps is not None:
        if n_epochs is not None or "udg_ft_epochs" in sweep_flags:
            raise UsageError(f"--steps: {setting.name} ({protocol.name}) counts its lengths in "
                             "epochs; give --epochs (EPOCHS) instead")
        if steps < 1:
            raise UsageError(f"--steps must be a positive integer, got {steps}")
        plan.notes.append(f"--steps {steps} replaces the table's length")
    if test_envs is not None:
        plan.notes.append("--test_envs " + " ".join(",".join(map(str, s)) for s in test_envs)
                          + ": only these of the table's test-environment sets")
    if clip_checkpoint is not None:
        if not protocol.alignment:
            raise UsageError(f"--clip_checkpoint: {setting.name} scores no images (no IP/OOP "
                             "evaluation)")
        plan.notes.append(f"CLIP weights for scoring read from {clip_checkpoint}, declared as "
                          f"the table's {protocol.alignment['pretrained'].value}")
    plan.root = output_dir
    too_short = []  # (steps per epoch, call) of the calls whose --epochs round to 0 steps
    holdout = protocol.holdout_fraction.value if protocol.holdout_fraction is not None else 0.2
    tail = ["--resume", "--skip_confirmation", "--eval_splits", eval_splits]
    if launcher:
        tail += ["--command_launcher", launcher]
    tail += list(extra)

    if protocol.alignment:
        scores_dir = os.path.join(output_dir, "alignment_scores")
        options = {k: v.value for k, v in protocol.alignment.items()}
        preset = options.pop("preset")
        if clip_checkpoint is not None:  # a local file of the table's weights (offline)
            options["pretrained_tag"] = options["pretrained"]
            options["pretrained"] = clip_checkpoint
        for dataset in use_datasets:
            out = os.path.join(scores_dir, f"{dataset}.csv")
            argv = ["--dataset", dataset, "--data_dir", data_dir, "--out", out]
            for name, value in options.items():
                argv += [f"--{name}", str(value)]
            # the summary and the model check it prints are those of the jobs' rule
            argv += ["--alignment_preset", str(preset)]
            plan.prepare.append(argv)
        plan.notes.append(f"IP/OOP: scores in {scores_dir}, split rule {preset}")

    for group in protocol.groups:
        folder = os.path.join(output_dir, group.folder) if group.folder else output_dir
        group_has_calls = False
        for run in protocol.runs:
            algs = [a for a in run.algorithms if a in use_algorithms]
            if not algs:
                continue
            run_hp = ps.run_hparams(protocol, group, run)
            run_hp.update(hparams or {})
            for dataset in use_datasets:
                argv = ["launch", "--datasets", dataset, "--algorithms", *algs,
                        "--data_dir", data_dir, "--output_dir", folder,
                        "--n_trials", str(protocol.n_trials.value),
                        "--n_hparams", str(protocol.n_hparams.value)]
                if run_hp:
                    argv += ["--hparams", json.dumps(run_hp, sort_keys=True)]
                if protocol.holdout_fraction is not None:
                    argv += ["--holdout_fraction", str(holdout)]
                for flag, value in sweep_flags.items():
                    argv += [f"--{flag}", *_flag_values(value)]
                if protocol.alignment:
                    argv += ["--alignment_scores",
                             os.path.join(output_dir, "alignment_scores", f"{dataset}.csv"),
                             "--alignment_preset", str(protocol.alignment["preset"].value)]
                name = f"{'/'.join(algs)} on {dataset}" + (f" ({group.title})" if
                                                           group.title else "")
                test_sets = _pick_test_env_sets(protocol, dataset, test_envs, setting.name)
                if n_epochs is not None:
                    for test_set in test_sets:
                        n_envs = len(catalog.DATASET_ENVIRONMENTS[dataset])
                        sources = [e for e in range(n_envs) if e not in test_set]
                        sizes, origin = training_in_sizes(dataset, sources, run_hp, holdout,
                                                          count_dir)
                        per_epoch = ps.steps_per_epoch(sizes, run_hp["batch_size"],
                                                       run_hp.get("batch_sampling", "per_domain"))
                        steps = int(round(n_epochs * per_epoch))
                        if steps < 1:
                            too_short.append((per_epoch, f"{name}, test envs {test_set}"))
                        label = (f"{name}, test envs {test_set}: {sum(sizes)} training images "
                                 f"({'+'.join(map(str, sizes))}; {origin}) / batch "
                                 f"{run_hp['batch_size']} = {per_epoch} steps per epoch x "
                                 f"{n_epochs:g} epochs = {steps} steps, a checkpoint every "
                                 "epoch")
                        plan.calls.append(SweepCall(
                            argv + ["--test_env_sets", ",".join(map(str, test_set)),
                                    "--steps", str(steps), "--checkpoint_freq", str(per_epoch)]
                            + tail, label, folder))
                else:
                    spec = protocol.test_envs.value
                    if test_envs is not None or not isinstance(spec, str):
                        argv += ["--test_env_sets", *(",".join(map(str, s)) for s in test_sets)]
                    elif spec == "single_test_envs":
                        argv.append("--single_test_envs")
                    else:
                        argv.append("--single_source")
                    if steps is not None:
                        argv += ["--steps", str(steps)]
                    elif dataset in protocol.steps:
                        argv += ["--steps", str(protocol.steps[dataset].value)]
                    if dataset in protocol.checkpoint_freq:
                        argv += ["--checkpoint_freq", str(protocol.checkpoint_freq[dataset].value)]
                    plan.calls.append(SweepCall(argv + tail, name, folder))
                group_has_calls = True
        if group_has_calls:
            paper = ["--paper", *group.paper_keys] if group.paper_keys else []
            plan.collects.append(["--input_dir", folder, "--selection",
                                  *protocol.selections.value, *paper, *protocol.collect_flags,
                                  "--format", "markdown"])
    if too_short:
        per_epoch, where = min(too_short)
        raise UsageError(
            f"EPOCHS {n_epochs:g} x {per_epoch} steps per epoch rounds to 0 steps for "
            f"{setting.name} ({protocol.name}), {where}: the smallest EPOCHS that gives one step "
            f"is {smallest_epochs(per_epoch):g} (reproduce: --epochs)")
    return plan


def smallest_epochs(per_epoch: int) -> float:
    """The smallest number of epochs, at two significant digits, that :func:`plan_setting`'s
    ``round(epochs x per_epoch)`` turns into at least one step."""
    epochs = 0.5 / per_epoch
    digits = 1 - math.floor(math.log10(epochs))
    epochs = math.ceil(epochs * 10 ** digits) / 10 ** digits
    while round(epochs * per_epoch) < 1:  # 0.5 rounds to 0 (to even)
        epochs += 10 ** -digits
    return round(epochs, digits)


# --------------------------------------------------------------------------------------------
# Jobs and their cost


@dataclass
class CallCost:
    """The jobs of one sweep call and their steps."""
    jobs: list
    selected: list  # the jobs a launch would start (Not launched, + Incomplete with --resume)
    steps: list[int]  # per job
    pretrain_steps: dict  # pretraining identity -> steps (UDG: run once, shared)
    resume: bool
    origins: set = field(default_factory=set)
    forwards: list = field(default_factory=list)  # per job: Forwards


def sweep_jobs(argv: list[str]):
    """``(args, jobs)`` of a ``sweep launch`` argv, enumerated exactly as
    :func:`dg_plugins.scripts.sweep.main` does (same parser, checks and ``make_args_list``), without
    launching or writing. A missing ``--alignment_scores`` file (scores not computed yet in a dry
    run) is allowed; its job args hold the path as the sweep would."""
    from dg_plugins.sweep import jobs as sweep_lib
    from dg_plugins.sweep import cli as sweep_cli

    parser = sweep_cli.build_parser()
    args = parser.parse_args(list(argv) + ["--dry_run"])
    if args.datasets is None:
        args.datasets = sweep_lib.default_datasets()
    if args.algorithms is None:
        args.algorithms = sweep_lib.default_algorithms()
    scores = args.alignment_scores
    deferred = scores is not None and not os.path.isfile(scores)
    if deferred:  # validate the rest; the score file's own flags need the file
        saved = {name: getattr(args, name) for name in sweep_lib.ALIGNMENT_ARGS}
        for name in saved:
            setattr(args, name, None)
    sweep_cli.validate(parser, args)
    if deferred:
        for name, value in saved.items():
            setattr(args, name, value)
        args.alignment_scores = os.path.abspath(scores)
    args_list = sweep_cli.make_args_list(args)
    return args, sweep_lib.make_jobs(args_list, args.output_dir,
                                     command_args=sweep_cli.command_args(args))


def _default_steps(dataset: str) -> int:
    import dg_plugins.datasets  # noqa: F401
    from dg_plugins.registry import DATASETS

    return int(DATASETS.get(dataset).N_STEPS)


def job_steps(train_args: dict, origins: set) -> tuple[int, tuple | None, int]:
    """``(training steps, pretraining identity or None, pretraining steps)`` of one job, as train
    will count them (UDG lengths in epochs: :mod:`dg_plugins.train.udg`)."""
    a = train_args
    dataset = a["dataset"]
    steps = a.get("steps")
    if "label_fraction" not in a:
        return (steps or _default_steps(dataset)), None, 0
    from dg_plugins import hparams as hp_lib
    from dg_plugins.algorithms.udg_finetune import finetune_settings
    from dg_plugins.train import udg as udg_jobs
    from dg_plugins.registry import ALGORITHMS

    hp = hp_lib.job_hparams(a["algorithm"], dataset, a["hparams_seed"], a["trial_seed"],
                            a.get("hparams"))
    fraction = float(a["label_fraction"])
    pretrains = ALGORITHMS.get(a["algorithm"]).supports_pretraining()
    n_envs = len(catalog.DATASET_ENVIRONMENTS[dataset])
    sources = [e for e in range(n_envs) if e not in a["test_envs"]]
    holdout = a["holdout_fraction"]
    data_dir = a.get("data_dir")
    if steps is None and a.get("udg_ft_epochs") is not None:
        sizes = dataset_sizes(dataset, data_dir)
        origins.add(sizes.source)
        labelled = [udg_jobs.labelled_count(ps.in_split_size(sizes.counts[e], holdout), fraction)
                    for e in sources]
        batch = finetune_settings(fraction, hp)[2] if pretrains else hp["batch_size"]
        steps = udg_jobs.steps_for_epochs(a["udg_ft_epochs"], labelled, batch)
    steps = steps or _default_steps(dataset)
    if not pretrains:
        return steps, None, 0
    pretrain = a.get("pretrain_steps")
    split = a.get("udg_split") or "domainbed"
    if pretrain is None and a.get("udg_pretrain_epochs") is not None:
        sizes = dataset_sizes(dataset, data_dir)
        origins.add(sizes.source)
        if split == "release":
            unlabelled = [max(1, int(round(udg_jobs.RELEASE_PRETRAIN_SHARE * sizes.counts[e])))
                          for e in sources]
        else:
            unlabelled = [ps.in_split_size(sizes.counts[e], holdout) for e in sources]
        pretrain = udg_jobs.steps_for_epochs(a["udg_pretrain_epochs"], unlabelled,
                                             hp["batch_size"])
    pretrain = pretrain or _default_steps(dataset)
    identity = json.dumps(udg_jobs.pretrain_identity(argparse.Namespace(**{
        "udg_split": split, **a}), hp, pretrain), sort_keys=True)
    return steps, identity, pretrain


def call_cost(argv: list[str], pretrainings: set | None = None, evaluated=None,
              forwards: bool = True) -> CallCost:
    """The jobs of a ``sweep launch`` argv, their steps and (``forwards``) image forwards
    (:func:`job_forwards`; ``evaluated``: the rule of the splits a record evaluates, default the
    train job's own). A UDG pretraining counts with the first job that needs it; its identity is
    then added to ``pretrainings`` (one set for the calls of one listing)."""
    from dg_plugins.sweep import jobs as sweep_lib

    args, jobs = sweep_jobs(argv)
    selected = sweep_lib.select_jobs(jobs, "launch", resume=args.resume)
    cost = CallCost(jobs, selected, [], {}, args.resume)
    pretrainings = set() if pretrainings is None else pretrainings
    for job in jobs:
        steps, identity, pretrain = job_steps(job.train_args, cost.origins)
        cost.steps.append(steps)
        runs_pretraining = identity is not None and identity not in pretrainings
        if identity is not None:
            cost.pretrain_steps[identity] = pretrain
            pretrainings.add(identity)
        if not forwards:
            continue
        counted = job_forwards(job.train_args, steps, pretrain if runs_pretraining else 0,
                               evaluated or evaluated_by_value)
        if runs_pretraining:
            counted.note = f"with the UDG pretraining it shares ({pretrain} steps)"
        elif identity is not None:
            counted.note = "its UDG pretraining counted with an earlier job"
        cost.forwards.append(counted)
    return cost


def print_call(cost: CallCost) -> None:
    """The sweep's dry-run listing (jobs, commands) and the call's count and steps."""
    for job in cost.jobs:
        print(job)
    from dg_plugins.sweep import jobs as sweep_lib

    print(sweep_lib.summary_line(cost.jobs))
    for job in cost.selected:
        print(job.command(resume=cost.resume and job.state == sweep_lib.INCOMPLETE))
    line = f"{len(cost.jobs)} jobs, {sum(cost.steps)} training steps"
    if cost.pretrain_steps:
        line += (f" + {sum(cost.pretrain_steps.values())} pretraining steps "
                 f"({len(cost.pretrain_steps)} pretrainings shared by the label fractions)")
    print(line)
    for origin in sorted(cost.origins):
        print(f"  image counts: {origin}")
    print("Image forwards per job (train; evaluation with --eval_splits selection / all):")
    for job, forwards in zip(cost.jobs, cost.forwards):
        note = "".join(f" [{text}]" for text in (forwards.note, forwards.unknown) if text)
        print(f"  {job.describe()}: {forwards_text(forwards.train, forwards.evaluation)}{note}")
    print(f"{len(cost.jobs)} jobs, image forwards: "
          f"{forwards_text(*sum_forwards(cost.forwards))}; {runs_with(cost.jobs)}")
    print(f"{len(cost.jobs)} jobs, GPU-hours (estimate): {gpu_line(sum_gpu(cost.forwards))}")


def total_line(costs: list[CallCost]) -> str:
    jobs = sum(len(c.jobs) for c in costs)
    steps = sum(sum(c.steps) for c in costs)
    pretrainings = {}
    for c in costs:
        pretrainings.update(c.pretrain_steps)
    line = f"Total: {jobs} jobs, {steps} training steps"
    if pretrainings:
        line += f" + {sum(pretrainings.values())} pretraining steps"
    to_run = sum(len(c.selected) for c in costs)
    if to_run != jobs:
        line += f" ({to_run} jobs to launch, the others done or incomplete)"
    items = [f for c in costs for f in c.forwards]
    train, evaluation = sum_forwards(items)
    shares = ", ".join(f"{_share(evaluation[v], train)} with {v}" for v in EVAL_SPLITS)
    gpu = sum_gpu(items)
    return "\n".join([
        line, f"Total image forwards: {forwards_text(train, evaluation)}; evaluation share "
        f"{shares}; {runs_with([j for c in costs for j in c.jobs])}", FORWARDS_DEFINITION,
        f"Total GPU-hours (estimate): {gpu_line(gpu)}", *missing_lines(gpu),
        gpu_hours_definition()])


def runs_with(jobs) -> str:
    """``the jobs run with --eval_splits V`` (each value with its count when they differ)."""
    values = [job.command_args.get("eval_splits", job.train_args.get("eval_splits", "all"))
              for job in jobs]
    if not values:
        return "no jobs"
    if len(set(values)) == 1:
        return f"the jobs run with --eval_splits {values[0]}"
    return "the jobs run with " + ", ".join(f"--eval_splits {v} ({values.count(v)})"
                                            for v in sorted(set(values)))


# --------------------------------------------------------------------------------------------
# Image forwards

#: The ``--eval_splits`` values, in the order the forwards are printed.
EVAL_SPLITS = ("selection", "all")
#: Forwards per image of a training step: its forward, and its backward counted as two.
TRAIN_FORWARDS_PER_IMAGE = 3
FORWARDS_DEFINITION = (
    "Image forwards: a training step counts 3 per image it trains on (forward and backward; "
    "per-domain batching: batch_size x source domains, pooled: the pooled batch, the UDG "
    "pretraining and fine-tuning by their own batches), an evaluation 1 per image of each split "
    "it evaluates, at every record (every checkpoint_freq steps and the last step); with "
    "--eval_splits selection a job evaluates only the splits its model selection reads, with "
    "all every split.")


@dataclass
class Forwards:
    """One job's image forwards (:func:`job_forwards`): ``train`` (with the UDG pretraining it
    runs for the jobs that share it: ``note``), ``evaluation`` per ``--eval_splits`` value (None:
    unknown, as the dataset's image counts are: ``unknown`` says why), and its estimated GPU
    time (``gpu``: :func:`job_gpu_time`)."""
    train: int | None
    evaluation: dict
    unknown: str = ""
    note: str = ""
    gpu: "GpuTime | None" = None


def split_sizes(a: dict, hparams: dict, origins: set) -> dict[str, int]:
    """Every split of the job of train args ``a`` by DomainBed's name (``env{i}_in``, then
    ``env{i}_out``, then ``env{k}_uda`` by position, as
    :meth:`dg_plugins.train.splits.Splits.eval_named`), with its size as
    :class:`~dg_plugins.train.splits.Splits` makes it: DomainBed's random holdout (the first
    ``int(n x holdout_fraction)`` images out), or under ``data_split: "official"`` the official
    lists (a source's train and crossval lists, a target's test and crossval lists); a test
    environment's uda split is ``int(in x uda_holdout_fraction)`` of its in-split (absent when
    empty). Raises :class:`UsageError` when the dataset's image counts are unknown."""
    dataset, test_envs = a["dataset"], set(a["test_envs"])
    data_dir = a.get("data_dir")
    n_envs = len(catalog.DATASET_ENVIRONMENTS[dataset])
    if hparams.get("data_split") == "official":
        lists, origin = official_list_sizes(dataset, data_dir)
        pairs = [(lists["test" if e in test_envs else "train"][e], lists["crossval"][e])
                 for e in range(n_envs)]
    else:
        sizes = dataset_sizes(dataset, data_dir)
        origin = sizes.source
        holdout = a.get("holdout_fraction", 0.2)
        pairs = [(kept := ps.in_split_size(n, holdout), n - kept) for n in sizes.counts]
    origins.add(origin)
    ins, outs, udas = {}, {}, []
    for e, (in_, out) in enumerate(pairs):
        if e in test_envs:
            uda = int(in_ * (a.get("uda_holdout_fraction") or 0.0))
            in_ -= uda
            if uda:
                udas.append(uda)
        ins[f"env{e}_in"], outs[f"env{e}_out"] = in_, out
    return {**ins, **outs, **{f"env{k}_uda": uda for k, uda in enumerate(udas)}}


def n_records(steps: int, checkpoint_freq: int) -> int:
    """Records of a job of ``steps`` steps: after every step ``s`` with ``s % checkpoint_freq ==
    0`` and after the last (:meth:`dg_plugins.train.job.Job.is_recorded`)."""
    last = steps - 1
    return last // checkpoint_freq + 1 + (last % checkpoint_freq != 0)


def training_images(a: dict, hparams: dict, sizes: dict | None, steps: int) -> int | None:
    """The images the ``steps`` training steps of the job of train args ``a`` train on
    (:data:`FORWARDS_DEFINITION`); ``sizes``: its :func:`split_sizes` (None when unknown: then a
    pooled job's count is unknown too, None)."""
    n_sources = len(catalog.DATASET_ENVIRONMENTS[a["dataset"]]) - len(set(a["test_envs"]))
    if "label_fraction" in a:  # UDG fine-tuning: its own batch per source domain
        from dg_plugins.algorithms.udg_finetune import finetune_settings
        from dg_plugins.registry import ALGORITHMS

        batch = (finetune_settings(float(a["label_fraction"]), hparams)[2]
                 if ALGORITHMS.get(a["algorithm"]).supports_pretraining()
                 else hparams["batch_size"])
        return batch * n_sources * steps
    batch = hparams["batch_size"]
    if hparams.get("batch_sampling", "per_domain") == "pooled":
        # one pass over the pooled source in-splits per epoch, its last batch partial
        if sizes is None:
            return None
        sources = [e for e in range(len(catalog.DATASET_ENVIRONMENTS[a["dataset"]]))
                   if e not in a["test_envs"]]
        pooled = sum(sizes[f"env{e}_in"] for e in sources)
        full, rest = divmod(steps, math.ceil(pooled / batch))
        return full * pooled + rest * batch
    streams = n_sources
    if a.get("task") == "domain_adaptation":  # one unlabelled batch per uda split too
        streams += sum(name.endswith("_uda") for name in sizes or {})
    return batch * streams * steps


def evaluated_by_value(a: dict, names: list[str]) -> dict[str, list[str]]:
    """``{--eval_splits value: the splits a record evaluates}`` for the job of train args ``a``
    whose splits are ``names`` (:func:`split_sizes`): the train job's own rule,
    :func:`dg_plugins.job.selection.evaluated_splits`."""
    from dg_plugins.job.selection import evaluated_splits

    n_envs = len(catalog.DATASET_ENVIRONMENTS[a["dataset"]])
    uda = sum(name.endswith("_uda") for name in names)
    return {value: evaluated_splits(value, a["test_envs"], n_envs, uda,
                                    udg="label_fraction" in a) for value in EVAL_SPLITS}


def job_forwards(a: dict, steps: int, pretrain_steps: int, evaluated) -> Forwards:
    """The image forwards of the job of train args ``a`` (:data:`FORWARDS_DEFINITION`):
    ``steps`` training steps, ``pretrain_steps`` steps of the UDG pretraining it runs (0 when it
    runs none or another job runs the shared one), and ``evaluated(a, split names) -> {value:
    names}``, the splits a record evaluates under each ``--eval_splits`` value."""
    from dg_plugins import hparams as hp_lib
    import dg_plugins.datasets  # noqa: F401
    from dg_plugins.registry import DATASETS

    hp = hp_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"], a["trial_seed"],
                            a.get("hparams"))
    n_sources = len(catalog.DATASET_ENVIRONMENTS[a["dataset"]]) - len(set(a["test_envs"]))
    try:
        sizes, unknown = split_sizes(a, hp, set()), ""
    except UsageError as err:
        sizes, unknown = None, str(err)
    trained = training_images(a, hp, sizes, steps)
    pretrained = hp["batch_size"] * n_sources * pretrain_steps
    images = None if trained is None else TRAIN_FORWARDS_PER_IMAGE * (trained + pretrained)
    if sizes is None:
        evaluation = {v: None for v in EVAL_SPLITS}
    else:
        freq = a.get("checkpoint_freq") or DATASETS.get(a["dataset"]).CHECKPOINT_FREQ
        records = n_records(steps, freq)
        names = evaluated(a, list(sizes))
        evaluation = {v: records * sum(sizes[n] for n in names[v]) for v in EVAL_SPLITS}
    return Forwards(images, evaluation, unknown,
                    gpu=job_gpu_time(a, hp, trained, pretrained, evaluation))


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def _share(evaluation: int | None, train: int | None) -> str:
    if evaluation is None or train is None:
        return "unknown"
    return f"{100 * evaluation / (evaluation + train):.0f}%" if evaluation + train else "0%"


def forwards_text(train: int | None, evaluation: dict) -> str:
    """``train T; evaluation S (selection) / A (all)``."""
    return (f"train {_count(train)}; evaluation " +
            " / ".join(f"{_count(evaluation[v])} ({v})" for v in EVAL_SPLITS))


def sum_forwards(items: list[Forwards]) -> tuple[int | None, dict]:
    """The train and per-value evaluation sums of ``items`` (None where one of them is
    unknown)."""
    train = None if any(f.train is None for f in items) else sum(f.train for f in items)
    evaluation = {v: (None if any(f.evaluation[v] is None for f in items)
                      else sum(f.evaluation[v] for f in items)) for v in EVAL_SPLITS}
    return train, evaluation


# --------------------------------------------------------------------------------------------
# GPU-hours


def gpu_hours_definition() -> str:
    """How the GPU-hours are estimated, with the device and date of the measurements."""
    from dg_plugins.reference import gpu_times

    t = gpu_times.load()
    size = f"{t.input_size}x{t.input_size}"
    return (f"GPU-hours: an estimate from {t.source()}, one GPU running one job at a time: per "
            f"job, the images it trains on x the measured {t.train_precision} step time of its "
            f"algorithm and network per image (steps of {t.batch_per_domain} images per domain "
            f"x {t.source_domains} source domains at {size}, scaled linearly to the job's images "
            "per step; DisMAE's UDG pretraining step is its measured step without the "
            "classifier's cross-entropy; ResNet-50 whatever its weights), plus its evaluation "
            f"forwards at the measured {t.eval_images_per_second:g} images/s ({t.eval_algorithm}"
            f", {t.eval_workers} loader workers; used for every network at {size}); loader "
            "waits, startup and checkpoints are not counted. What benchmark gpu did not measure "
            "is left out and named, not guessed ('+ not measured' in a table; '+ unknown': image "
            "counts not known).")


#: Why a part of a job is left out of its GPU-hours: no measured time of its network or its
#: evaluation, or unknown image counts.
NOT_MEASURED, UNKNOWN = "not measured", "unknown"


@dataclass
class GpuTime:
    """One job's (or a sum's) estimated GPU seconds: ``seconds`` per ``--eval_splits`` value, of
    the parts estimated; ``missing``: what is left out, name -> (:data:`NOT_MEASURED` or
    :data:`UNKNOWN`, why); ``notes``: what the estimate does not follow."""
    seconds: dict
    missing: dict = field(default_factory=dict)
    notes: set = field(default_factory=set)


def _vit_name(arch: str) -> str:
    """``deit_small_patch16_224`` -> ``DeiT-S/16``; other names as they are."""
    import re

    match = re.match(r"(vit|deit)_(tiny|small|base|large|huge)_patch(\d+)", arch)
    if not match:
        return arch
    family, size, patch = match.groups()
    return f"{'DeiT' if family == 'deit' else 'ViT'}-{size[0].upper()}/{patch}"


def network_label(algorithm: str, dataset: str, hparams: dict) -> tuple[str, str]:
    """``(the algorithm, its network)`` as ``benchmark gpu`` names its rows ("ERM", "ResNet-50";
    "GMoE", "DeiT-S/16"): the network the job builds, by the rules it builds it with."""
    from dg_plugins.algorithms.dismae import ENCODER_ARCH_224, MAE, DisMAE
    from dg_plugins.algorithms.gmoe import DEIT_S, ERM_ViT
    from dg_plugins.networks import featurizers, vit
    from dg_plugins.registry import ALGORITHMS, DATASETS

    shape = DATASETS.get(dataset).INPUT_SHAPE
    cls = ALGORITHMS.get(algorithm)
    arch = hparams.get("vit_arch", "auto")
    try:
        if isinstance(cls, type) and issubclass(cls, ERM_ViT):
            return algorithm, _vit_name(vit.resolve_vit_arch(arch, shape, arch_224=DEIT_S))
        if isinstance(cls, type) and issubclass(cls, (DisMAE, MAE)):
            return algorithm, _vit_name(vit.resolve_vit_arch(arch, shape,
                                                             arch_224=ENCODER_ARCH_224))
        backbone = featurizers.backbone_for(shape, hparams)
        if backbone == "resnet":
            return algorithm, ("ResNet-18" if featurizers.resnet_arch(hparams) == "resnet18"
                               else "ResNet-50")
        if backbone == "vit":
            return algorithm, ("DINOv2 ViT-B/14" if hparams.get("dinov2") else
                               _vit_name(vit.resolve_vit_arch(arch, shape)))
        return algorithm, {"lenet": "LeNet", "mnist_cnn": "MNIST CNN"}.get(backbone, backbone)
    except (ValueError, KeyError):
        return algorithm, f"network of {dataset}"


def job_gpu_time(a: dict, hparams: dict, trained: int | None, pretrained: int,
                 evaluation: dict) -> GpuTime:
    """The estimated GPU seconds of the job of train args ``a`` (:func:`gpu_hours_definition`):
    ``trained`` images of training (UDG: of fine-tuning; None: unknown), ``pretrained`` images of
    the UDG pretraining it runs, ``evaluation`` forwards per ``--eval_splits`` value."""
    from dg_plugins.reference import gpu_times
    from dg_plugins.registry import ALGORITHMS, DATASETS

    from dg_plugins.job.flags import compute_settings

    times = gpu_times.load()
    algorithm, network = network_label(a["algorithm"], a["dataset"], hparams)
    parts = [(f"{algorithm} {network}", trained)]
    if "label_fraction" in a and ALGORITHMS.get(a["algorithm"]).supports_pretraining():
        parts = [(f"{algorithm} {network}", pretrained),
                 (f"UDG fine-tuning {network}", trained)]
    gpu = GpuTime({v: 0.0 for v in EVAL_SPLITS})
    changed = compute_settings(a)
    if changed:
        gpu.notes.add("estimated with train's default compute settings; jobs here run with "
                      + ", ".join(f"--{k} {v}" for k, v in changed.items()))
    for label, images in parts:
        per_image = times.seconds_per_training_image(label)
        if per_image is None or images is None:
            gpu.missing[label] = ((NOT_MEASURED, "no benchmark gpu row") if per_image is None
                                  else (UNKNOWN, "its training images are unknown"))
        elif images:
            for v in EVAL_SPLITS:
                gpu.seconds[v] += images * per_image
    shape = tuple(DATASETS.get(a["dataset"]).INPUT_SHAPE or ())
    if shape[1:] != (times.input_size,) * 2:
        gpu.missing[f"{a['dataset']} evaluation"] = (
            NOT_MEASURED, f"evaluation measured at {times.input_size}x{times.input_size} only")
    elif any(evaluation[v] is None for v in EVAL_SPLITS):
        gpu.missing[f"{a['dataset']} evaluation"] = (UNKNOWN, "its image counts are unknown")
    else:
        for v in EVAL_SPLITS:
            gpu.seconds[v] += evaluation[v] / times.eval_images_per_second
    return gpu


def sum_gpu(items: list[Forwards]) -> GpuTime:
    """The sum of the jobs' GPU times (the parts left out: their union)."""
    total = GpuTime({v: 0.0 for v in EVAL_SPLITS})
    for f in items:
        for v in EVAL_SPLITS:
            total.seconds[v] += f.gpu.seconds[v]
        total.missing.update(f.gpu.missing)
        total.notes |= f.gpu.notes
    return total


def gpu_hours_text(gpu: GpuTime, value: str) -> str:
    """A table cell: ``12.3``; ``12.3 + not measured`` / ``+ unknown`` where parts are left out
    (:data:`NOT_MEASURED`, :data:`UNKNOWN`; the lines under the table name them); ``not
    measured`` or ``unknown`` alone where nothing is estimated."""
    tags = sorted({tag for tag, _ in gpu.missing.values()})
    if not gpu.seconds[value] and tags:
        return " + ".join(tags)
    return " + ".join([f"{gpu.seconds[value] / 3600:,.1f}", *tags])


def gpu_line(gpu: GpuTime) -> str:
    """``S (selection) / A (all) on <device>[; left out: ...]``."""
    from dg_plugins.reference import gpu_times

    device = gpu_times.load().device
    if not any(gpu.seconds.values()) and gpu.missing:
        return f"not measured on {device} ({', '.join(sorted(gpu.missing))})"
    line = " / ".join(f"{gpu.seconds[v] / 3600:,.1f} ({v})" for v in EVAL_SPLITS)
    left_out = f"; left out: {', '.join(sorted(gpu.missing))}" if gpu.missing else ""
    return f"{line} on {device}{left_out}"


def missing_lines(gpu: GpuTime) -> list[str]:
    return ([f"  left out of the GPU-hours: {name}: {tag}, {why}"
             for name, (tag, why) in sorted(gpu.missing.items())]
            + [f"  GPU-hours note: {note}" for note in sorted(gpu.notes)])


# --------------------------------------------------------------------------------------------
# Prerequisites

#: Datasets whose ``data_split: "official"`` reads split lists, and the downloader's name of them.
OFFICIAL_SPLIT_LISTS = {"PACS": "PACS_splits"}


def plan_costs(plan: Plan) -> list[CallCost]:
    """The jobs of every sweep call of ``plan`` (enumerated, nothing launched; no forwards)."""
    return [call_cost(call.argv, forwards=False) for call in plan.calls]


def prerequisites(plan: Plan, data_dir: str, costs: list[CallCost]) -> list[str]:
    """Everything the jobs ``reproduce`` would launch need before the first one starts, found at
    once for every sweep call of the setting: the data folder, each dataset's files
    (:func:`dg_plugins.sweep.checks.data_problems`, DomainNet-20's class folders), the official
    split lists of ``data_split: "official"`` jobs, the CLIP weights of a score file still to
    compute, the pretrained weights of every backbone
    (:func:`dg_plugins.sweep.checks.weight_problems`) and a writable output folder. One line each,
    naming the fix; [] when nothing is missing."""
    from dg_plugins.download.sources import download_command
    from dg_plugins.sweep import checks as sweep_lib

    jobs = [job for cost in costs for job in cost.selected]
    if not jobs and not plan.prepare:
        return []
    problems = []
    datasets = list(dict.fromkeys(job.train_args["dataset"] for job in jobs))
    data = sweep_lib.data_problems(jobs)  # none for built-in datasets ("--data_dir builtin")
    if data and not os.path.isdir(data_dir):  # one line for all of them
        command = download_command(datasets, data_dir)
        problems.append(f"the data folder {data_dir} (--data_dir, DATA_DIR) does not exist: "
                        "point it at the folder that holds the datasets"
                        + (f", or download them there: {command}" if command else ""))
    else:
        problems += data
        if "DomainNet20" in datasets and os.path.isdir(os.path.join(data_dir, "domain_net")):
            from dg_plugins.download.prepare import domainnet20_problem

            missing = domainnet20_problem(data_dir)
            if missing:
                problems.append(f"DomainNet20: {missing}; DomainNet20 reads the 20 classes of "
                                f"DomainNet's folders: {download_command('DomainNet', data_dir)}")
    for dataset, lists in OFFICIAL_SPLIT_LISTS.items():
        if not any(job.train_args["dataset"] == dataset
                   and json.loads(job.train_args.get("hparams") or "{}").get("data_split")
                   == "official" for job in jobs):
            continue
        from dg_plugins.download.prepare import split_lists_status

        status, detail = ("absent", "") if not os.path.isdir(data_dir) else \
            split_lists_status(lists, data_dir)
        if status != "ok":
            problems.append(f"{dataset}'s official split lists (data_split 'official'): "
                            f"{detail or 'not there'}; to download them (after {dataset}): "
                            f"{download_command(lists, data_dir)}")
    for argv in plan.prepare:
        if os.path.isfile(argv[argv.index("--out") + 1]):
            continue  # scored before: alignment_scores reads its cache
        from dg_plugins.alignment import scoring

        model, pretrained = argv[argv.index("--model") + 1], argv[argv.index("--pretrained") + 1]
        try:
            scoring.check_weights_available(model, pretrained)
        except (OSError, ValueError, RuntimeError) as err:
            line = " ".join(str(err).split())
            problem = (f"scoring images for IP/OOP ({model} {pretrained}): {line} With "
                       "reproduce: --clip_checkpoint FILE (sweeps/*.sh: CLIP_CHECKPOINT=FILE).")
            if problem not in problems:
                problems.append(problem)
    problems += sweep_lib.output_problems(jobs)
    by_error: dict[str, list[str]] = {}
    for line in sweep_lib.weight_problems(jobs):  # "<algorithm> on <dataset>: <error>"
        what, _, error = line.partition(": ")
        by_error.setdefault(error, []).append(what)
    shared = ("" if len(plan.protocol.groups) < 2 else
              f" Here one pretrained_path would go to every backbone of {plan.setting.name} "
              "(one folder each): put each backbone's file at its cache path instead.")
    problems += [f"{', '.join(whats)}: {error}{shared}" for error, whats in by_error.items()]
    return problems


def report_prerequisites(plan: Plan, problems: list[str], dry: bool) -> None:
    """Print the missing prerequisites: as errors before a real run that launches nothing, as
    warnings after a dry run's listing."""
    kind = "warning" if dry else "error"
    for problem in problems:
        print(f"{kind}: {problem}", file=sys.stderr)
    what = f"{plan.setting.name} ({plan.protocol.name})"
    if dry:
        print(f"warning: {len(problems)} prerequisite(s) of {what} missing (above): a real run "
              "would launch nothing until they are there.", file=sys.stderr)
    else:
        print(f"Nothing was launched: {len(problems)} prerequisite(s) of {what} missing "
              "(above); fix them and rerun the same command.", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Commands


def _module_line(module: str, argv: list[str]) -> str:
    return shlex.join([sys.executable, "-m", f"dg_plugins.scripts.{module}", *argv])


def dry_run(plan: Plan, data_dir: str) -> int:
    setting, protocol = plan.setting, plan.protocol
    print(f"== {setting.name} ({setting.script}), protocol {protocol.name}: {protocol.summary}")
    print(f"   paper: {setting.paper}, {setting.table}")
    for note in plan.notes:
        print(f"   note: {note}")
    print(f"   differences from the source: {len(protocol.differences)} (reproduce "
          f"{setting.name} --protocol {protocol.name} --describe lists them)")
    for argv in plan.prepare:
        print(f"-- score: {_module_line('alignment_scores', argv)}")
    costs, pretrainings = [], set()
    for i, call in enumerate(plan.calls, 1):
        print(f"-- sweep {i}/{len(plan.calls)}: {call.label}")
        print(f"$ {_module_line('sweep', call.argv)}")
        cost = call_cost(call.argv, pretrainings)
        print_call(cost)
        costs.append(cost)
    print(total_line(costs))
    for argv in plan.collects:
        print(f"-- tables: {_module_line('collect_results', argv)}")
    print("Dry run: nothing launched or written.", flush=True)
    problems = prerequisites(plan, data_dir, costs)
    if problems:
        report_prerequisites(plan, problems, dry=True)
    return 0


def run(plan: Plan, data_dir: str) -> int:
    from dg_plugins.scripts import collect_results
    from dg_plugins.sweep import cli as sweep_cli

    setting, protocol = plan.setting, plan.protocol
    header = f"{setting.name}, protocol {protocol.name}: {protocol.summary}"
    print(f"== {header}", flush=True)
    for note in plan.notes:
        print(f"   note: {note}")
    problems = prerequisites(plan, data_dir, plan_costs(plan))
    if problems:
        report_prerequisites(plan, problems, dry=False)
        return 2
    if plan.root:  # what ran, beside the sweep folders (collect_results reads only job folders)
        from dg_plugins.files import atomic_write_bytes

        os.makedirs(plan.root, exist_ok=True)
        atomic_write_bytes(os.path.join(plan.root, "reproduce.txt"), (
            f"$ {shlex.join([sys.executable, '-m', 'dg_plugins.scripts.reproduce', *plan.argv])}\n"
            + "".join(f"note: {note}\n" for note in plan.notes)
            + ps.describe(setting, protocol)).encode())
    for argv in plan.prepare:
        from dg_plugins.scripts import alignment_scores

        os.makedirs(os.path.dirname(argv[argv.index("--out") + 1]), exist_ok=True)
        print(f"-- score: {_module_line('alignment_scores', argv)}", flush=True)
        code = alignment_scores.main(argv)
        if code:
            return code
    status = 0
    for i, call in enumerate(plan.calls, 1):
        print(f"-- sweep {i}/{len(plan.calls)}: {call.label}", flush=True)
        print(f"$ {_module_line('sweep', call.argv)}", flush=True)
        code = sweep_cli.main(call.argv)
        if code >= 128:  # stopped by a signal: start nothing more
            print(f"Stopped at sweep {i}/{len(plan.calls)}; rerun the same command to continue "
                  "(finished jobs are skipped, interrupted ones resume).", flush=True)
            return code
        if code == 2:  # refused (bad input or a failed check): the next calls would be too
            print(f"Sweep {i}/{len(plan.calls)} launched nothing (see above); fix that and "
                  "rerun the same command.", flush=True)
            return code
        status = status or code
    for argv in plan.collects:
        print(f"-- tables of {header}", flush=True)
        print(f"-- {_module_line('collect_results', argv)}", flush=True)
        code = collect_results.main(argv)
        status = status or code
    return status


def list_settings(data_dir: str | None, forwards: bool = False) -> int:
    """One row per setting and protocol: script, paper table, jobs, total steps, paper rows;
    with ``forwards`` the image forwards instead (:func:`list_forwards`)."""
    if forwards:
        return list_forwards(data_dir)
    print("| setting | script | paper table | protocol | jobs | total steps | paper rows |")
    print("|---|---|---|---|---|---|---|")
    for setting in ps.SETTINGS.values():
        for protocol in setting.protocols.values():
            plan = plan_setting(setting, protocol, data_dir=data_dir or "DATA_DIR",
                                output_dir="OUTPUT_DIR", count_dir=data_dir)
            costs = [call_cost(call.argv, forwards=False) for call in plan.calls]
            jobs = sum(len(c.jobs) for c in costs)
            steps = sum(sum(c.steps) for c in costs)
            pretrain = {}
            for c in costs:
                pretrain.update(c.pretrain_steps)
            steps_text = f"{steps:,}" + (f" + {sum(pretrain.values()):,} pretraining"
                                         if pretrain else "")
            keys = ", ".join(dict.fromkeys(k for g in protocol.groups for k in g.paper_keys))
            print(f"| {setting.name} | {setting.script} | {setting.table} | {protocol.name} | "
                  f"{jobs} | {steps_text} | {keys} |")
    return 0


def _millions(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1e6:,.1f}M"


def list_forwards(data_dir: str | None) -> int:
    """One row per setting and protocol: jobs, the image forwards of training and of evaluation
    with ``--eval_splits selection`` and ``all``, each evaluation's share of the total, and the
    totals (train + evaluation); the image counts are those under ``data_dir`` when given, else
    the recorded full-size counts. Datasets whose counts are unknown are named under the
    table."""
    from dg_plugins.reference import gpu_times

    device = gpu_times.load().device
    print(FORWARDS_DEFINITION)
    print("| setting | script | protocol | jobs | train | evaluation, selection | evaluation, "
          "all | evaluation share, selection / all | image forwards (train + eval), selection "
          f"(all) | GPU-hours ({device}), selection | GPU-hours ({device}), all |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    unknown, left_out = {}, {}
    for setting in ps.SETTINGS.values():
        for protocol in setting.protocols.values():
            plan = plan_setting(setting, protocol, data_dir=data_dir or "DATA_DIR",
                                output_dir="OUTPUT_DIR", count_dir=data_dir)
            pretrainings: set = set()
            costs = [call_cost(call.argv, pretrainings) for call in plan.calls]
            items = [f for c in costs for f in c.forwards]
            for f in items:
                if f.unknown:
                    unknown.setdefault(f.unknown, set()).add(f"{setting.name} ({protocol.name})")
            train, evaluation = sum_forwards(items)
            known = [f for f in items if not f.unknown]
            _, counted = sum_forwards(known)
            eval_text = [_millions(evaluation[v]) if evaluation[v] is not None else
                         f"{_millions(counted[v])} + unknown" if known else "unknown"
                         for v in EVAL_SPLITS]
            share = " / ".join(_share(evaluation[v], train) for v in EVAL_SPLITS)
            totals = (f"{_millions(train + evaluation['selection'])} "
                      f"({_millions(train + evaluation['all'])})"
                      if train is not None and evaluation["all"] is not None else "unknown")
            train_text = _millions(train)
            gpu = sum_gpu(items)
            for name, (tag, why) in gpu.missing.items():
                left_out.setdefault((name, f"{tag}: {why}"), set()).add(
                    f"{setting.name} ({protocol.name})")
            print(f"| {setting.name} | {setting.script} | {protocol.name} | {len(items)} | "
                  f"{train_text} | {eval_text[0]} | {eval_text[1]} | {share} | {totals} | "
                  f"{gpu_hours_text(gpu, 'selection')} | {gpu_hours_text(gpu, 'all')} |")
    for why, where in unknown.items():
        print(f"unknown evaluation forwards in {', '.join(sorted(where))}: {why}")
    print(gpu_hours_definition())
    for (name, why), where in sorted(left_out.items()):
        print(f"left out of the GPU-hours: {name} ({why}) in {', '.join(sorted(where))}")
    return 0


def dry_run_sweeps(tokens: list[str]) -> int:
    """List the jobs, count and total steps of plain sweep calls (``::``-separated)."""
    calls, current = [], []
    for token in tokens:
        if token == CALL_SEPARATOR:
            if current:
                calls.append(current)
            current = []
        else:
            current.append(token)
    if current:
        calls.append(current)
    if not calls:
        raise UsageError("--dry_run_sweeps needs sweep calls: launch FLAGS [:: launch FLAGS ...]")
    costs, pretrainings = [], set()
    for i, argv in enumerate(calls, 1):
        if argv[0] != "launch":
            raise UsageError(f"--dry_run_sweeps: call {i} must start with 'launch', got "
                             f"{argv[0]!r}")
        print(f"-- sweep {i}/{len(calls)}")
        print(f"$ {_module_line('sweep', argv)}")
        cost = call_cost(argv, pretrainings)
        print_call(cost)
        costs.append(cost)
    print(total_line(costs))
    print("Dry run: nothing launched or written.")
    return 0


# --------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dg_plugins.scripts.reproduce",
        description="Run a paper setting (dg_plugins/reference/paper_settings.py): its sweeps, "
                    "then its tables beside the paper's rows. Extra arguments are sweep flags "
                    "passed to every sweep call.")
    parser.add_argument("setting", nargs="?", help="one of: " + ", ".join(ps.SETTINGS))
    parser.add_argument("--protocol", choices=ps.PROTOCOLS, default=None,
                        help="release (the official release's protocol) or domainbed "
                             "(DomainBed's protocol with the paper's hparams); default: release "
                             "where the paper has a release")
    parser.add_argument("--data_dir", default=None, help="the data folder (required to launch)")
    parser.add_argument("--output_dir", default=None,
                        help="the protocol's sweeps go to OUTPUT_DIR/<protocol> (default: "
                             "sweep_output/<setting>)")
    parser.add_argument("--command_launcher", default="local",
                        help="sweep launcher (local, multi_gpu, submitit, ...; default local)")
    parser.add_argument("--dry_run", action="store_true",
                        help="print the calls, jobs, their count and total steps; launch and "
                             "write nothing")
    parser.add_argument("--list", action="store_true",
                        help="every setting and protocol with its jobs and total steps")
    parser.add_argument("--forwards", action="store_true",
                        help="with --list: the image forwards of training and evaluation "
                             "(--eval_splits selection and all) and the estimated GPU-hours of "
                             "every setting and protocol, "
                             "from the recorded full-size image counts (or those under "
                             "--data_dir)")
    parser.add_argument("--describe", action="store_true",
                        help="every value of the setting's protocol with its source, and the "
                             "differences the host cannot express")
    parser.add_argument("--datasets", nargs="+", default=None,
                        help="run only these of the setting's datasets")
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="run only these of the setting's algorithms")
    parser.add_argument("--hparams", default=None,
                        help="JSON object added to every run's hparams (e.g. a local "
                             "pretrained_path); printed jobs show the result")
    parser.add_argument("--epochs", type=float, default=None,
                        help="replace an epoch-based setting's training (or UDG fine-tuning) "
                             "epochs, e.g. 50 for DMG's paper budget")
    parser.add_argument("--pretrain_epochs", type=float, default=None,
                        help="replace a UDG setting's pretraining epochs")
    parser.add_argument("--steps", type=int, default=None,
                        help="replace a step-based setting's training steps (a short trial "
                             "run; the table's checkpoint frequency stays, the last step is "
                             "always recorded)")
    parser.add_argument("--test_envs", nargs="+", default=None, metavar="SET",
                        help="run only these of the setting's test-environment sets, each "
                             "comma-separated (e.g. 0, or 1,2,3 for the single-source job "
                             "trained on environment 0)")
    parser.add_argument("--clip_checkpoint", default=None, metavar="FILE",
                        help="IP/OOP settings: score with this local copy of the table's CLIP "
                             "weights (e.g. open_clip_pytorch_model.bin of "
                             "timm/vit_base_patch16_clip_224.laion400m_e32) instead of the "
                             "download cache")
    parser.add_argument("--eval_splits", choices=("selection", "all"), default="selection",
                        help="selection (default): every job evaluates only the splits model "
                             "selection reads (the same tables, less evaluation); all: every "
                             "split at every record (full learning curves)")
    parser.add_argument("--dry_run_sweeps", action="store_true",
                        help="list plain sweep calls given after it: launch FLAGS [:: launch "
                             "FLAGS ...] (the DRY_RUN=1 mode of sweeps/*.sh)")
    return parser


def check_extra(extra: list[str], protocol: ps.Protocol | None = None) -> None:
    """Refuse pass-through sweep flags that the setting's table owns (see the module
    docstring; ``protocol``'s ``sweep_flags`` too, e.g. GMoE's release pins
    ``--eval_batch_size``); unknown flags fail as sweep would fail on them."""
    from dg_plugins.sweep import cli as sweep_cli

    parser = sweep_cli.build_parser()
    base = ["launch", "--output_dir", "-", "--data_dir", "-"]
    defaults = vars(parser.parse_args(base))
    given = vars(parser.parse_args(base + list(extra)))
    pinned = set(protocol.sweep_flags) if protocol is not None else set()
    owned = [name for name in defaults
             if name in OWNED_SWEEP_FLAGS or name.startswith("udg_") or name in pinned]
    changed = [name for name in owned if given[name] != defaults[name]]
    if changed:
        raise UsageError(f"{', '.join('--' + n for n in changed)}: set by the setting's table "
                         "(reproduce SETTING --describe shows it); to run other values, run "
                         "python -m dg_plugins.scripts.sweep with the flags --dry_run prints")


def require_torch() -> None:
    """Raise :class:`UsageError` naming this interpreter and the install command when it cannot
    import torch (every listing and sweep needs it; ``--describe`` does not): the one line a
    paper script run with another ``PYTHON`` prints."""
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as err:
        exe = shlex.quote(sys.executable)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        package = shlex.quote(root) if os.path.isfile(os.path.join(root, "setup.cfg")) else \
            "dg_plugins"
        raise UsageError(f"{exe} cannot import torch ({err}), which dg_plugins needs: install the "
                         f"package into it ({exe} -m pip install -e {package}), or run the "
                         "interpreter that has it (sweeps/*.sh: PYTHON=.venv/bin/python)") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if "--dry_run_sweeps" in argv:
        i = argv.index("--dry_run_sweeps")
        if argv[:i]:
            parser.error("--dry_run_sweeps takes only sweep calls after it")
        try:
            require_torch()
            return dry_run_sweeps(argv[i + 1:])
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    args, extra = parser.parse_known_args(argv)
    try:
        if args.forwards and not args.list:
            parser.error("--forwards goes with --list (a dry run prints the forwards anyway)")
        if args.list:
            require_torch()
            return list_settings(args.data_dir, args.forwards)
        if args.setting is None:
            parser.error("give a SETTING (one of: " + ", ".join(ps.SETTINGS) + ") or --list")
        try:
            setting = ps.get_setting(args.setting)
            protocol = ps.get_protocol(setting, args.protocol)
        except KeyError as err:
            parser.error(err.args[0])
        if args.describe:
            sys.stdout.write(ps.describe(setting, protocol))
            return 0
        if args.data_dir is None:
            parser.error("--data_dir is required (the folder holding the datasets)")
        require_torch()
        if any(not token.startswith("-") for token in extra[:1]):
            parser.error(f"unexpected argument {extra[0]!r}: extra arguments are sweep flags "
                         "such as --n_trials 1")
        check_extra(extra, protocol)
        hparams = None
        if args.hparams is not None:
            from dg_plugins.hparams import parse_overrides

            try:
                hparams = parse_overrides(args.hparams)
            except ValueError as err:
                parser.error(str(err))
        output_dir = os.path.join(args.output_dir or os.path.join("sweep_output", setting.name),
                                  protocol.name)
        test_envs = None if args.test_envs is None else parse_test_env_sets(args.test_envs)
        clip = None if args.clip_checkpoint is None else os.path.abspath(args.clip_checkpoint)
        plan = plan_setting(setting, protocol, data_dir=args.data_dir, output_dir=output_dir,
                            launcher=args.command_launcher, datasets=args.datasets,
                            algorithms=args.algorithms, epochs=args.epochs,
                            pretrain_epochs=args.pretrain_epochs, steps=args.steps,
                            test_envs=test_envs, clip_checkpoint=clip, hparams=hparams,
                            extra=extra, eval_splits=args.eval_splits)
        plan.argv = argv
        if hparams:
            plan.notes.append(f"--hparams {json.dumps(hparams, sort_keys=True)} added to every "
                              "run's hparams")
        return dry_run(plan, args.data_dir) if args.dry_run else run(plan, args.data_dir)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
