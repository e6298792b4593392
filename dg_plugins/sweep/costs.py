"""What a sweep's jobs cost, counted without running them: training steps (UDG pretraining shared),
image forwards and estimated GPU time, for the sweep's prompt and reproduce's dry runs."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field

from dg_plugins import hparams as hp_lib
from dg_plugins.job.sizes import in_split_size, records_after
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.sweep.gpu_hours import GpuTime, job_gpu_time
from dg_plugins.sweep.image_counts import (EVAL_SPLITS, UsageError, dataset_sizes,
                                           evaluated_by_value, n_environments,
                                           register_datasets, split_sizes)


def _default_steps(dataset: str) -> int:
    register_datasets()
    return int(DATASETS.get(dataset).N_STEPS)


def job_steps(train_args: dict, origins: set) -> tuple[int, tuple | None, int]:
    """``(training steps, pretraining identity or None, pretraining steps)`` of one job."""
    a = train_args
    dataset = a["dataset"]
    steps = a.get("steps")
    if "label_fraction" not in a:
        return (steps or _default_steps(dataset)), None, 0
    from dg_plugins.algorithms.udg_finetune import finetune_settings  # imports torch
    from dg_plugins.train import udg as udg_jobs

    hp = hp_lib.job_hparams(a["algorithm"], dataset, a["hparams_seed"], a["trial_seed"],
                            a.get("hparams"))
    fraction = float(a["label_fraction"])
    pretrains = ALGORITHMS.get(a["algorithm"]).supports_pretraining()
    n_envs = n_environments(dataset, a.get("data_dir"))
    sources = [e for e in range(n_envs) if e not in a["test_envs"]]
    holdout = a["holdout_fraction"]
    data_dir = a.get("data_dir")
    if steps is None and a.get("udg_ft_epochs") is not None:
        sizes = dataset_sizes(dataset, data_dir)
        origins.add(sizes.source)
        labelled = [udg_jobs.labelled_count(in_split_size(sizes.counts[e], holdout), fraction)
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
            unlabelled = [in_split_size(sizes.counts[e], holdout) for e in sources]
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


def jobs_cost(train_args: list, pretrainings: set | None = None, evaluated=None,
              forwards: bool = True) -> JobsCost:
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
        counted = job_forwards(a, steps, pretrain if runs_pretraining else 0,
                               evaluated or evaluated_by_value)
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
    n_sources = n_environments(a["dataset"], a.get("data_dir")) - len(set(a["test_envs"]))
    if "label_fraction" in a:  # UDG fine-tuning: its own batch per source domain
        from dg_plugins.algorithms.udg_finetune import finetune_settings  # imports torch

        batch = (finetune_settings(float(a["label_fraction"]), hparams)[2]
                 if ALGORITHMS.get(a["algorithm"]).supports_pretraining()
                 else hparams["batch_size"])
        return batch * n_sources * steps
    batch = hparams["batch_size"]
    if hparams.get("batch_sampling", "per_domain") == "pooled":
        # one pass over the pooled source in-splits per epoch, its last batch partial
        if sizes is None:
            return None
        sources = [e for e in range(n_environments(a["dataset"], a.get("data_dir")))
                   if e not in a["test_envs"]]
        pooled = sum(sizes[f"env{e}_in"] for e in sources)
        full, rest = divmod(steps, math.ceil(pooled / batch))
        return full * pooled + rest * batch
    streams = n_sources
    if a.get("task") == "domain_adaptation":  # one unlabelled batch per uda split too
        streams += sum(name.endswith("_uda") for name in sizes or {})
    return batch * streams * steps


def job_forwards(a: dict, steps: int, pretrain_steps: int, evaluated) -> Forwards:
    """The image forwards of the job of train args ``a`` (:data:`FORWARDS_DEFINITION`)."""
    register_datasets()
    hp = hp_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"], a["trial_seed"],
                            a.get("hparams"))
    n_sources = n_environments(a["dataset"], a.get("data_dir")) - len(set(a["test_envs"]))
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
        records = records_after(-1, steps, freq)  # every record of the job
        names = evaluated(a, list(sizes))
        evaluation = {v: records * sum(sizes[n] for n in names[v]) for v in EVAL_SPLITS}
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
