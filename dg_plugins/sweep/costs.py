"""What a sweep's jobs cost, counted without running them: images per environment (on disk, built
in, or recorded in paper_settings) and per split, training steps (a UDG pretraining shared), image
forwards and GPU-hours from the measured times (:mod:`dg_plugins.reference.gpu_times`), for the
sweep's prompt (:func:`print_estimate`, before ``Are you sure? (y/n)`` and in a dry run) and
reproduce's dry runs (docs/reproduce.md). The prompt's are counted in a child process (``python -m
dg_plugins.sweep.costs``: the sweep stays torch-free; it also times steps) with a time limit."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from dg_plugins import catalog, plugins
from dg_plugins import hparams as hp_lib
from dg_plugins.job import selection as job_selection
from dg_plugins.job import sizes as job_sizes
from dg_plugins.job.flags import compute_settings
from dg_plugins.layouts import (DOMAINNET20_CLASSES, PACS_SPLIT_KINDS, list_images,
                                pacs_split_file, visible_subfolders)
from dg_plugins.reference import gpu_times
from dg_plugins.reference import paper_settings as ps
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.runtime import pick_device
from dg_plugins.sweep.jobs import SweepJob, num_environments
from dg_plugins.sweep.progress import format_duration


class UsageError(ValueError):
    """Bad input: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Sizes:
    """Images per environment of a dataset and where the counts come from."""
    counts: tuple[int, ...]
    source: str


def register_datasets() -> None:
    """Register every dataset of dg_plugins (on first use: the datasets import torch)."""
    import dg_plugins.datasets  # noqa: F401


@functools.cache
def dataset_sizes(dataset: str, data_dir: str | None) -> Sizes:
    """Images per environment of ``dataset``: counted on disk, built in, else recorded."""
    found = _count_on_disk(dataset, data_dir) or _built_in(dataset, data_dir)
    recorded = ps.DATASET_SIZES.get(dataset)
    if found or recorded is not None:
        return found or Sizes(tuple(recorded.value), f"recorded counts "
                              f"({_where(dataset, data_dir)} not found): {recorded.source}")
    raise UsageError(f"no image counts of {dataset}: no data in {_where(dataset, data_dir)} and "
                     "none recorded in dg_plugins/reference/paper_settings.py (DATASET_SIZES)")


def _built_in(dataset: str, data_dir: str | None) -> Sizes | None:
    """Images per environment of an in-memory dataset (under ``--data_dir builtin``: built here)."""
    register_datasets()
    if dataset not in DATASETS or not getattr(DATASETS.get(dataset), "IN_MEMORY", False):
        return None
    if dataset == "DigitsOffline":
        from dg_plugins.datasets import digits_offline  # imports torch

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
    if catalog.IMAGE_FOLDER_DATASETS.get(dataset, "") is None:  # the generic ImageFolder
        return data_dir
    register_datasets()
    if dataset not in DATASETS:
        return None
    folder = getattr(DATASETS.get(dataset), "FOLDER_NAME", None)
    return os.path.join(data_dir, folder) if folder else None


def _where(dataset: str, data_dir: str | None) -> str:
    return _dataset_folder(dataset, data_dir) or (data_dir or "no --data_dir")


def _count_on_disk(dataset: str, data_dir: str | None) -> Sizes | None:
    root = _dataset_folder(dataset, data_dir)
    if root is None or not os.path.isdir(root):
        return None
    envs = visible_subfolders(root)
    expected = catalog.DATASET_ENVIRONMENTS.get(dataset)
    if expected is not None and len(envs) != len(expected):
        raise UsageError(f"{root} holds {len(envs)} domain folders ({', '.join(envs)}), {dataset} "
                         f"has {len(expected)}: fix the folder or pass another --data_dir")
    classes = DOMAINNET20_CLASSES if dataset == "DomainNet20" else None
    counts = [sum(len(list_images(os.path.join(root, env, c)))
                  for c in visible_subfolders(os.path.join(root, env))
                  if classes is None or c in classes) for env in envs]
    return Sizes(tuple(counts), f"counted on disk in {root}")


def official_list_sizes(dataset: str, data_dir: str | None) -> tuple[dict, str]:
    """``({kind: images per environment}, origin)`` of the official ``*_kfold.txt`` lists."""
    root = _dataset_folder(dataset, data_dir)
    if root is not None and os.path.isdir(root):
        counts: dict[str, list[int]] = {kind: [] for kind in PACS_SPLIT_KINDS}
        envs = visible_subfolders(root)
        paths = [(kind, os.path.join(root, pacs_split_file(env, kind))) for env in envs
                 for kind in PACS_SPLIT_KINDS]
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


#: The ``--eval_splits`` values, printed cheapest first.
EVAL_SPLITS = job_selection.EVAL_SPLITS[::-1]


def split_sizes(a: dict, hparams: dict, origins: set) -> dict[str, int]:
    """Every split of the job of train args ``a`` with its size (``origins``: where from)."""
    dataset, test_envs = a["dataset"], set(a["test_envs"])
    data_dir = a.get("data_dir")
    n_envs = num_environments(dataset, data_dir)
    if hparams.get("data_split") == "official":
        lists, origin = official_list_sizes(dataset, data_dir)
        pairs = [(lists["test" if e in test_envs else "train"][e], lists["crossval"][e])
                 for e in range(n_envs)]
    else:
        sizes = dataset_sizes(dataset, data_dir)
        origin = sizes.source
        pairs = job_sizes.random_holdout_pairs(sizes.counts, a.get("holdout_fraction", 0.2))
    origins.add(origin)
    return job_sizes.split_sizes(pairs, test_envs, a.get("uda_holdout_fraction") or 0.0)


def gpu_hours_definition() -> str:
    """How the GPU-hours are estimated, with the device and date of the measurements."""
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


#: Why a part of a job is left out of its GPU-hours: no measured time, or unknown image counts.
NOT_MEASURED, UNKNOWN = "not measured", "unknown"


@dataclass
class GpuTime:
    """Estimated GPU seconds per ``--eval_splits`` value, the parts left out and notes."""
    seconds: dict
    missing: dict = field(default_factory=dict)
    notes: set = field(default_factory=set)


def _vit_name(arch: str) -> str:
    """``deit_small_patch16_224`` -> ``DeiT-S/16``; other names as they are."""
    if not (match := re.match(r"(vit|deit)_(tiny|small|base|large|huge)_patch(\d+)", arch)):
        return arch
    family, size, patch = match.groups()
    return f"{'DeiT' if family == 'deit' else 'ViT'}-{size[0].upper()}/{patch}"


def network_label(algorithm: str, dataset: str, hparams: dict) -> tuple[str, str]:
    """``(the algorithm, its network)`` as ``benchmark gpu`` names its rows ("ERM", "ResNet-50")."""
    from dg_plugins.algorithms.dismae import ENCODER_ARCH_224, MAE, DisMAE  # imports torch
    from dg_plugins.algorithms.gmoe import DEIT_S, ERM_ViT
    from dg_plugins.networks import featurizers, vit

    shape = DATASETS.get(dataset).INPUT_SHAPE
    cls = ALGORITHMS.get(algorithm)
    arch = hparams.get("vit_arch", "auto")
    try:
        if isinstance(cls, type) and issubclass(cls, (ERM_ViT, DisMAE, MAE)):  # their own ViTs
            arch_224 = DEIT_S if issubclass(cls, ERM_ViT) else ENCODER_ARCH_224
            return algorithm, _vit_name(vit.resolve_vit_arch(arch, shape, arch_224=arch_224))
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
    """The estimated GPU seconds of the job of train args ``a`` from its images and forwards."""
    times = gpu_times.load()
    algorithm, network = network_label(a["algorithm"], a["dataset"], hparams)
    parts = [(f"{algorithm} {network}", trained)]
    if "label_fraction" in a and ALGORITHMS.get(a["algorithm"]).supports_pretraining():
        parts = [(f"{algorithm} {network}", pretrained),
                 (f"UDG fine-tuning {network}", trained)]
    gpu = GpuTime({v: 0.0 for v in EVAL_SPLITS})
    if changed := compute_settings(a):
        gpu.notes.add("estimated with train's default compute settings; jobs here run with "
                      + ", ".join(f"--{k} {v}" for k, v in changed.items()))
    size = hparams.get(catalog.IMAGE_SIZE_HPARAM, times.input_size)
    for label, images in parts:
        per_image = times.seconds_per_training_image(label)
        if size != times.input_size:  # the image-size hparam: rows measured at 224x224 only
            gpu.missing[label] = (NOT_MEASURED, f"measured at {times.input_size}x"
                                                f"{times.input_size} only, not {size}x{size}")
        elif per_image is None or images is None:
            gpu.missing[label] = ((NOT_MEASURED, "no benchmark gpu row") if per_image is None
                                  else (UNKNOWN, "its training images are unknown"))
        elif images:
            gpu.seconds = {v: s + images * per_image for v, s in gpu.seconds.items()}
    shape = tuple(DATASETS.get(a["dataset"]).INPUT_SHAPE or ())
    if shape[1:] != (times.input_size,) * 2 or size != times.input_size:
        gpu.missing[f"{a['dataset']} evaluation"] = (
            NOT_MEASURED, f"evaluation measured at {times.input_size}x{times.input_size} only")
    elif any(evaluation[v] is None for v in EVAL_SPLITS):
        gpu.missing[f"{a['dataset']} evaluation"] = (UNKNOWN, "its image counts are unknown")
    else:
        gpu.seconds = {v: s + evaluation[v] / times.eval_images_per_second
                       for v, s in gpu.seconds.items()}
    return gpu


def sum_gpu(items: list) -> GpuTime:
    """The sum of the GPU times of the jobs' ``Forwards`` (the parts left out: their union)."""
    total = GpuTime({v: 0.0 for v in EVAL_SPLITS})
    for f in items:
        total.seconds = {v: s + f.gpu.seconds[v] for v, s in total.seconds.items()}
        total.missing.update(f.gpu.missing)
        total.notes |= f.gpu.notes
    return total


def gpu_hours_text(gpu: GpuTime, value: str) -> str:
    """A table cell: ``12.3``, ``12.3 + not measured`` (parts left out), or the tags alone."""
    tags = sorted({tag for tag, _ in gpu.missing.values()})
    hours = [] if not gpu.seconds[value] and tags else [f"{gpu.seconds[value] / 3600:,.1f}"]
    return " + ".join([*hours, *tags])


def gpu_line(gpu: GpuTime) -> str:
    """``S (selection) / A (all) on <device>[; left out: ...]``."""
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


def _default_steps(dataset: str) -> int:
    register_datasets()
    return int(DATASETS.get(dataset).N_STEPS)


def _udg_batch(a: dict, hparams: dict) -> int:
    """A UDG fine-tuning step's images per source domain (its own batch after a pretraining)."""
    if not ALGORITHMS.get(a["algorithm"]).supports_pretraining():
        return hparams["batch_size"]
    from dg_plugins.algorithms.udg_finetune import finetune_settings  # imports torch

    return finetune_settings(float(a["label_fraction"]), hparams)[2]


def job_steps(train_args: dict, origins: set) -> tuple[int, tuple | None, int]:
    """``(training steps, pretraining identity or None, pretraining steps)`` of one job."""
    a = train_args
    dataset = a["dataset"]
    steps = a.get("steps")
    if "label_fraction" not in a:
        return (steps or _default_steps(dataset)), None, 0
    from dg_plugins.train import udg as udg_jobs

    hp = hp_lib.job_hparams(a["algorithm"], dataset, a["hparams_seed"], a["trial_seed"],
                            a.get("hparams"))
    data_dir, holdout = a.get("data_dir"), a["holdout_fraction"]
    sources = [e for e in range(num_environments(dataset, data_dir)) if e not in a["test_envs"]]
    if steps is None and a.get("udg_ft_epochs") is not None:
        sizes = dataset_sizes(dataset, data_dir)
        origins.add(sizes.source)
        labelled = [udg_jobs.labelled_count(job_sizes.in_split_size(sizes.counts[e], holdout),
                                            float(a["label_fraction"])) for e in sources]
        steps = udg_jobs.steps_for_epochs(a["udg_ft_epochs"], labelled, _udg_batch(a, hp))
    steps = steps or _default_steps(dataset)
    if not ALGORITHMS.get(a["algorithm"]).supports_pretraining():
        return steps, None, 0
    pretrain = a.get("pretrain_steps")
    split = a.get("udg_split") or "domainbed"
    if pretrain is None and a.get("udg_pretrain_epochs") is not None:
        sizes = dataset_sizes(dataset, data_dir)
        origins.add(sizes.source)
        unlabelled = [max(1, int(round(udg_jobs.RELEASE_PRETRAIN_SHARE * sizes.counts[e])))
                      if split == "release" else job_sizes.in_split_size(sizes.counts[e], holdout)
                      for e in sources]
        pretrain = udg_jobs.steps_for_epochs(a["udg_pretrain_epochs"], unlabelled,
                                             hp["batch_size"])
    pretrain = pretrain or _default_steps(dataset)
    identity = json.dumps(udg_jobs.pretrain_identity(argparse.Namespace(**{
        "udg_split": split, **a}), hp, pretrain), sort_keys=True)
    return steps, identity, pretrain


@dataclass
class JobsCost:
    """Jobs' steps, UDG pretrainings (identity -> steps), image count origins, :class:`Forwards`."""
    steps: list = field(default_factory=list)
    pretrain_steps: dict = field(default_factory=dict)
    origins: set = field(default_factory=set)
    forwards: list = field(default_factory=list)


def jobs_cost(train_args: list, pretrainings: set | None = None, forwards: bool = True) -> JobsCost:
    """The steps and image forwards of the jobs of ``train_args`` (a pretraining counted once)."""
    cost = JobsCost()
    pretrainings = set() if pretrainings is None else pretrainings
    for a in train_args:
        steps, identity, pretrain = job_steps(a, cost.origins)
        cost.steps.append(steps)
        runs_pretraining = identity is not None and identity not in pretrainings
        if identity is not None:
            cost.pretrain_steps[identity] = pretrain
            pretrainings.add(identity)
        if not forwards:
            continue
        counted = job_forwards(a, steps, pretrain if runs_pretraining else 0)
        if runs_pretraining:
            counted.note = f"with the UDG pretraining it shares ({pretrain} steps)"
        elif identity is not None:
            counted.note = "its UDG pretraining counted with an earlier job"
        cost.forwards.append(counted)
    return cost


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
    """One job's image forwards (None: unknown, ``unknown`` says why) and estimated GPU time."""
    train: int | None
    evaluation: dict
    unknown: str = ""
    note: str = ""
    gpu: "GpuTime | None" = None


def training_images(a: dict, hparams: dict, sizes: dict | None, steps: int) -> int | None:
    """The images the ``steps`` training steps of the job of train args ``a`` train on."""
    n_envs = num_environments(a["dataset"], a.get("data_dir"))
    n_sources = n_envs - len(set(a["test_envs"]))
    if "label_fraction" in a:  # UDG fine-tuning: its own batch per source domain
        return _udg_batch(a, hparams) * n_sources * steps
    batch = hparams["batch_size"]
    if hparams.get("batch_sampling", "per_domain") == "pooled":
        # one pass over the pooled source in-splits per epoch, its last batch partial
        if sizes is None:
            return None
        pooled = sum(sizes[f"env{e}_in"] for e in range(n_envs) if e not in a["test_envs"])
        full, rest = divmod(steps, math.ceil(pooled / batch))
        return full * pooled + rest * batch
    streams = n_sources
    if a.get("task") == "domain_adaptation":  # one unlabelled batch per uda split too
        streams += sum(name.endswith("_uda") for name in sizes or {})
    return batch * streams * steps


def job_forwards(a: dict, steps: int, pretrain_steps: int) -> Forwards:
    """The image forwards of the job of train args ``a`` (:data:`FORWARDS_DEFINITION`)."""
    register_datasets()
    hp = hp_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"], a["trial_seed"],
                            a.get("hparams"))
    n_envs = num_environments(a["dataset"], a.get("data_dir"))
    n_sources = n_envs - len(set(a["test_envs"]))
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
        records = job_sizes.records_after(-1, steps, freq)  # every record of the job
        uda = sum(name.endswith("_uda") for name in sizes)
        evaluation = {v: records * sum(sizes[n] for n in job_selection.evaluated_splits(
            v, a["test_envs"], n_envs, uda, udg="label_fraction" in a)) for v in EVAL_SPLITS}
    return Forwards(images, evaluation, unknown,
                    gpu=job_gpu_time(a, hp, trained, pretrained, evaluation))


def count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def evaluation_share(evaluation: int | None, train: int | None) -> str:
    """The evaluation's share of all forwards, ``12%`` (``unknown`` where a count is)."""
    if evaluation is None or train is None:
        return "unknown"
    return f"{100 * evaluation / (evaluation + train):.0f}%" if evaluation + train else "0%"


def forwards_text(train: int | None, evaluation: dict) -> str:
    """``train T; evaluation S (selection) / A (all)``."""
    return (f"train {count(train)}; evaluation " +
            " / ".join(f"{count(evaluation[v])} ({v})" for v in EVAL_SPLITS))


def sum_forwards(items: list[Forwards]) -> tuple[int | None, dict]:
    """The train and per-value evaluation sums of ``items`` (None where one is unknown)."""
    train = None if any(f.train is None for f in items) else sum(f.train for f in items)
    evaluation = {v: (None if any(f.evaluation[v] is None for f in items)
                      else sum(f.evaluation[v] for f in items)) for v in EVAL_SPLITS}
    return train, evaluation


#: The child process: ``python -m CHILD_MODULE`` (:func:`main`; never imported by the package).
CHILD_MODULE = "dg_plugins.sweep.costs"
#: The whole estimate's limit in seconds (the timed steps: a third of it); 0 leaves it out.
TIMEOUT_ENV, DEFAULT_TIMEOUT_S = "DG_SWEEP_ESTIMATE_TIMEOUT", 180.0
REMOTE_LAUNCHERS = {"submitit": "the submitit launcher runs the jobs on the cluster's nodes"}


def print_estimate(jobs: Sequence[SweepJob], launcher: str | None = None) -> bool:
    """Print the cost lines of ``jobs`` as the child writes them (False: it failed or timed out)."""
    limit = DEFAULT_TIMEOUT_S
    with contextlib.suppress(ValueError):
        limit = max(0.0, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    if not jobs or not limit:
        return True
    data = json.dumps({  # the child's input (main)
        "jobs": [{"train_args": job.train_args, "command_args": job.command_args}
                 for job in jobs],
        "budget_s": limit / 3, "remote": REMOTE_LAUNCHERS.get(launcher or "")}).encode()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=dict(os.environ))
        deadline = time.monotonic() + limit
        timer = threading.Timer(limit, proc.kill)  # the time limit ends the lines below
        timer.start()
        try:
            with contextlib.suppress(OSError):  # the child died at once: its error is read below
                proc.stdin.write(data)
                proc.stdin.close()
            for raw in proc.stdout:
                print(raw.decode(errors="replace").rstrip("\n"), flush=True)
            proc.wait()
        finally:
            timer.cancel()
            proc.kill()  # a no-op once it has exited (an error above: it is stopped)
            proc.wait()
        if proc.returncode == -signal.SIGKILL and time.monotonic() >= deadline:
            print(f"(the cost estimate stopped after {limit:g} s, ${TIMEOUT_ENV}: what it had "
                  "not printed by then is left out)", flush=True)
            return False
        if proc.returncode:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines() or ["no message"]
            print(f"(the cost estimate failed, exit status {proc.returncode}: "
                  f"{lines[-1].strip()}; the launch does not depend on it)", flush=True)
            return False
    return True


#: A step of the job's own batch is timed only when it takes at most this long (else 2 images per
#: domain, scaled per image); jobs shorter than this many steps per configuration are not timed.
TARGET_STEP_S, SHORT_STEPS_PER_CONFIG = 1.5, 50


#: The line protocol's stream (``main`` sends whatever else is printed to stderr).
OUT = sys.stdout


def write(*lines: str) -> None:
    print("".join(f"{line}\n" for line in lines), end="", file=OUT, flush=True)


@dataclass
class Config:
    """What a timed step depends on (the first job's hparams), and what was measured."""
    label: str  # "ERM ResNet-50"
    algorithm: str
    hparams: dict
    input_shape: tuple
    num_classes: int
    num_domains: int
    batch: int  # images per domain of the job's step
    compute: dict
    device: str | None
    jobs: list = field(default_factory=list)  # indices of its jobs
    train_s: float | None = None
    eval_s: float | None = None
    timed_images: int = 0
    failed: str = ""


def num_classes(dataset: str, data_dir: str | None) -> int:
    """The dataset's classes: declared, or its image tree's class folders (else 10)."""
    if dataset in catalog.DATASET_CLASSES:
        return catalog.DATASET_CLASSES[dataset]
    folder = catalog.IMAGE_FOLDER_DATASETS.get(dataset, "")
    if folder != "" and data_dir:
        root = os.path.join(data_dir, folder) if folder else data_dir
        with contextlib.suppress(OSError):
            return max(1, len({c for d in visible_subfolders(root)
                               for c in visible_subfolders(os.path.join(root, d))}))
    return 10


def configs_of(jobs: list, hparams: list) -> tuple[list[Config], list[int]]:
    """The distinct configurations of ``jobs`` (those of UDG jobs aside: their indices)."""
    configs: dict = {}
    udg = []
    for i, (job, hp) in enumerate(zip(jobs, hparams)):
        a = job["train_args"]
        if "label_fraction" in a:
            udg.append(i)
            continue
        dataset = a["dataset"]
        algorithm, network = network_label(a["algorithm"], dataset, hp)
        shape = ((3, *(hp.get(catalog.IMAGE_SIZE_HPARAM, catalog.IMAGE_SIZE),) * 2)
                 if dataset in catalog.IMAGE_FOLDER_DATASETS
                 else tuple(DATASETS.get(dataset).INPUT_SHAPE))
        domains = num_environments(dataset, a.get("data_dir")) - len(set(a["test_envs"]))
        compute = compute_settings(a)
        device = a.get("device")
        key = (algorithm, network, shape, domains, json.dumps(compute, sort_keys=True), device)
        if key not in configs:
            configs[key] = Config(f"{algorithm} {network}", a["algorithm"], hp, shape,
                                  num_classes(dataset, a.get("data_dir")), domains,
                                  int(hp["batch_size"]), compute, device)
        configs[key].jobs.append(i)
    return list(configs.values()), udg


def time_config(config: Config, deadline: float) -> None:
    """Time a training step and a prediction of ``config`` per image, on random images."""
    import torch

    from dg_plugins.algorithms.base import gradient_scaling
    from dg_plugins.train.compute import Compute

    device = pick_device(config.device)
    compute = Compute.of(config.compute)
    torch.manual_seed(0)
    hp = {**config.hparams, "pretrained": False}  # random init: the same step, no download
    with contextlib.redirect_stdout(sys.stderr):  # off the line protocol (stdout)
        algorithm = ALGORITHMS.get(config.algorithm)(config.input_shape, config.num_classes,
                                                     config.num_domains, hp).to(device)
        compute.prepare_model(algorithm)
    scaler = compute.make_scaler(device)
    algorithm.train()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def batches(b: int) -> list:
        return [(compute.model_input(torch.randn(b, *config.input_shape, device=device)),
                 torch.randint(config.num_classes, (b,), device=device))
                for _ in range(config.num_domains)]

    def step(b: int) -> float:  # seconds per image
        minibatches = batches(b)
        sync()
        start = time.perf_counter()
        with compute.active(device), compute.autocast(device), gradient_scaling(scaler):
            algorithm.update(minibatches, None)
        sync()
        return (time.perf_counter() - start) / (b * config.num_domains)

    small, full = min(2, config.batch), config.batch
    with contextlib.redirect_stdout(sys.stderr):
        step(small)  # warm-up: allocations, kernels chosen
        b, per_image = small, step(small)
        if time.monotonic() < deadline:
            per_image = min(per_image, step(small))  # the faster of two: less noise
        if (full > small and per_image * full * config.num_domains <= TARGET_STEP_S
                and time.monotonic() < deadline):  # the job's own batch, when it is cheap
            b, per_image = full, min(step(full), step(full))
        algorithm.eval()
        x = batches(b)[0][0]
        with torch.no_grad(), compute.active(device), compute.autocast(device):
            algorithm.predict(x)
            sync()
            start = time.perf_counter()
            algorithm.predict(x)
            sync()
            config.eval_s = (time.perf_counter() - start) / b
    config.train_s = per_image
    config.timed_images = b * config.num_domains


def print_costs(jobs: list):
    """Print the costs of ``jobs``: (cost, evaluation forwards, the GPU time covers all)."""
    cost = jobs_cost([job["train_args"] for job in jobs])
    values = [job.get("command_args", {}).get("eval_splits")  # its command's, else train's
              or job["train_args"].get("eval_splits") or job_selection.DEFAULT_EVAL_SPLITS
              for job in jobs]
    line = f"Cost of the {len(jobs)} jobs: {sum(cost.steps):,} training steps"
    if cost.pretrain_steps:
        line += f" + {sum(cost.pretrain_steps.values()):,} pretraining steps"
    trained = sum_forwards(cost.forwards)[0]
    evaluated = [f.evaluation[v] for f, v in zip(cost.forwards, values)]
    evaluation = None if None in evaluated else sum(evaluated)
    runs = ", ".join(v + (f" ({values.count(v)} jobs)" if len(set(values)) > 1 else "")
                     for v in sorted(set(values)))
    write(f"{line}; image forwards: train {count(trained)}, evaluation {count(evaluation)} "
          f"(eval_splits {runs})", *(f"  image counts: {o}" for o in sorted(cost.origins)),
          *(f"  unknown: {why}" for why in sorted({f.unknown for f in cost.forwards if f.unknown})))
    device = gpu_times.load().device
    gpu = sum_gpu(cost.forwards)
    seconds = sum(f.gpu.seconds[v] for f, v in zip(cost.forwards, values))
    left_out = ("; left out: " + ", ".join(f"{name} ({tag}: {why})" for name, (tag, why)
                                           in sorted(gpu.missing.items())) if gpu.missing else "")
    write(f"GPU time (estimate, from the step times measured on an {device}, one job at a "
          f"time): {format_duration(seconds)}{left_out}" if seconds else
          f"GPU time: not estimated (no step time measured on an {device} for these "
          f"jobs{left_out})")
    write(*(f"  GPU time note: {note}" for note in sorted(gpu.notes)))
    return cost, evaluated, not gpu.missing


def machine_time(jobs: list, cost, evaluated: list, measured: bool, budget: float) -> str:
    """The time of ``jobs`` on this machine from steps timed here, or why it is not estimated."""
    import torch

    from dg_plugins.train.progress import format_duration as exact_duration

    hparams = [hp_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"],
                                  a["trial_seed"], a.get("hparams"))
               for a in (job["train_args"] for job in jobs)]
    configs, udg = configs_of(jobs, hparams)
    if not configs:
        return "Time on this machine: not estimated (UDG jobs are not timed here)"
    devices = {pick_device(c.device) for c in configs}
    where = ", ".join(sorted(f"{torch.cuda.get_device_name(d)}, cuda" if d.type == "cuda" else
                             d.type if torch.cuda.is_available() else f"{d.type}, no GPU visible"
                             for d in devices))
    steps = sum(cost.steps)
    if all(d.type == "cuda" for d in devices) and measured:
        return (f"Time on this machine ({where}): not timed here; the GPU estimate above applies,"
                f" as this GPU compares with an {gpu_times.load().device}")
    if steps < SHORT_STEPS_PER_CONFIG * len(configs):
        return (f"Time on this machine ({where}): not timed, the jobs are short ({steps:,} "
                "training steps in all)")
    write(f"Timing a training step of {', '.join(c.label for c in configs)} on this machine "
          f"({where}; random images, a few seconds each)...")
    deadline = time.monotonic() + budget
    for config in configs:
        if time.monotonic() >= deadline:
            config.failed = f"not timed within {budget:g} s"
            continue
        try:
            time_config(config, deadline)
        except Exception as err:  # noqa: BLE001  (an estimate never stops a launch)
            config.failed = f"its step failed here: {type(err).__name__}: {err}"
    total, counted, parts = 0.0, 0, []
    for config in configs:
        if config.train_s is None:
            parts.append(f"{config.label}: {config.failed}")
            continue
        images_per_step = config.batch * config.num_domains
        for i in config.jobs:
            f = cost.forwards[i]
            images = (f.train // TRAIN_FORWARDS_PER_IMAGE if f.train is not None
                      else cost.steps[i] * images_per_step)
            total += images * config.train_s + (evaluated[i] or 0) * config.eval_s
            counted += 1
        timed = (f" (timed on {config.timed_images})"
                 if config.timed_images != images_per_step else "")
        parts.append(f"{config.label}: {exact_duration(config.train_s * images_per_step)} a "
                     f"step of {images_per_step} images{timed}")
    if not counted:
        return f"Time on this machine ({where}): not estimated ({'; '.join(parts)})"
    jobs_text = f"{counted} jobs" if counted == len(jobs) else f"{counted} of the {len(jobs)} jobs"
    left = f"; left out: {len(udg)} UDG jobs" if udg else ""
    return (f"Estimated on this machine ({where}): {format_duration(total)} for {jobs_text}, one "
            f"at a time ({'; '.join(parts)}; timed here on random images and scaled per image, "
            f"evaluation included; loading, start-up and checkpoints not counted{left})")


def main() -> int:
    """The estimate's child: read the request (:func:`print_estimate`) on stdin, print the lines."""
    request = json.load(sys.stdin)
    sys.stdout = sys.stderr  # whatever the imports print stays off the protocol
    plugins.load()
    cost, evaluated, measured = print_costs(request["jobs"])
    write(f"Time on this machine: not estimated ({request['remote']})" if request.get("remote")
          else machine_time(request["jobs"], cost, evaluated, measured,
                            float(request.get("budget_s", 60))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
