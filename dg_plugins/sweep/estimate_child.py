"""The child process of the sweep's cost estimate (:mod:`dg_plugins.sweep.estimate`): jobs as JSON
on stdin; prints their costs, GPU time, and time on this machine from steps timed here."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

#: A step of the job's own batch is timed only when it takes at most this long (else 2 images per
#: domain, scaled per image); jobs shorter than this many steps per configuration are not timed.
TARGET_STEP_S, SHORT_STEPS_PER_CONFIG = 1.5, 50


#: The line protocol's stream (``main`` sends whatever else is printed to stderr).
OUT = sys.stdout


def write(*lines: str) -> None:
    print("".join(f"{line}\n" for line in lines), end="", file=OUT, flush=True)


def job_eval_splits(job: dict) -> str:
    """The ``--eval_splits`` value a job runs with (its command's, else train's default)."""
    from dg_plugins.job.selection import DEFAULT_EVAL_SPLITS

    return (job.get("command_args", {}).get("eval_splits")
            or job["train_args"].get("eval_splits") or DEFAULT_EVAL_SPLITS)


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


def input_shape(dataset: str, hparams: dict) -> tuple:
    from dg_plugins import catalog
    from dg_plugins.registry import DATASETS

    if dataset in catalog.IMAGE_FOLDER_DATASETS:
        size = hparams.get(catalog.IMAGE_SIZE_HPARAM, catalog.IMAGE_SIZE)
        return (3, size, size)
    return tuple(DATASETS.get(dataset).INPUT_SHAPE)


def num_classes(dataset: str, data_dir: str | None) -> int:
    """The dataset's classes: declared, or its image tree's class folders (else 10)."""
    from dg_plugins import catalog
    from dg_plugins.layouts import visible_subfolders

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
    from dg_plugins.job import flags as job_flags
    from dg_plugins.sweep.gpu_hours import network_label
    from dg_plugins.sweep.image_counts import n_environments

    configs: dict = {}
    udg = []
    for i, (job, hp) in enumerate(zip(jobs, hparams)):
        a = job["train_args"]
        if "label_fraction" in a:
            udg.append(i)
            continue
        dataset = a["dataset"]
        algorithm, network = network_label(a["algorithm"], dataset, hp)
        shape = input_shape(dataset, hp)
        domains = n_environments(dataset, a.get("data_dir")) - len(set(a["test_envs"]))
        compute = job_flags.compute_settings(a)
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
    from dg_plugins.registry import ALGORITHMS
    from dg_plugins.runtime import pick_device
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

    def step(b: int) -> float:
        minibatches = batches(b)
        sync()
        start = time.perf_counter()
        with compute.active(device), compute.autocast(device), gradient_scaling(scaler):
            algorithm.update(minibatches, None)
        sync()
        return time.perf_counter() - start

    small = min(2, config.batch)
    with contextlib.redirect_stdout(sys.stderr):
        step(small)  # warm-up: allocations, kernels chosen
        b, seconds = small, step(small)
        if time.monotonic() < deadline:
            seconds = min(seconds, step(small))  # the faster of two: less of the machine's noise
        per_image = seconds / (small * config.num_domains)
        full = config.batch
        if (full > small and per_image * full * config.num_domains <= TARGET_STEP_S
                and time.monotonic() < deadline):  # the job's own batch, when it is cheap
            seconds = min(step(full), step(full))
            b, per_image = full, seconds / (full * config.num_domains)
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


def device_label(device) -> str:
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, cuda"
    return f"{device.type}, no GPU visible" if not torch.cuda.is_available() else device.type


def print_costs(jobs: list):
    """Print the costs of ``jobs``: (cost, evaluation forwards, the GPU time covers all)."""
    from dg_plugins.reference import gpu_times
    from dg_plugins.sweep.costs import count, jobs_cost, sum_forwards
    from dg_plugins.sweep.gpu_hours import sum_gpu
    from dg_plugins.sweep.progress import format_duration

    cost = jobs_cost([job["train_args"] for job in jobs])
    values = [job_eval_splits(job) for job in jobs]
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
    if seconds:
        write(f"GPU time (estimate, from the step times measured on an {device}, one job at a "
              f"time): {format_duration(seconds)}{left_out}")
    else:
        write(f"GPU time: not estimated (no step time measured on an {device} for these "
              f"jobs{left_out})")
    write(*(f"  GPU time note: {note}" for note in sorted(gpu.notes)))
    return cost, evaluated, not gpu.missing


def machine_time(jobs: list, cost, evaluated: list, measured: bool, budget: float) -> str:
    """The time of ``jobs`` on this machine from steps timed here, or why it is not estimated."""
    from dg_plugins import hparams as hp_lib
    from dg_plugins.reference import gpu_times
    from dg_plugins.runtime import pick_device
    from dg_plugins.sweep.costs import TRAIN_FORWARDS_PER_IMAGE
    from dg_plugins.sweep.progress import format_duration
    from dg_plugins.train.progress import format_duration as exact_duration

    hparams = [hp_lib.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"],
                                  a["trial_seed"], a.get("hparams"))
               for a in (job["train_args"] for job in jobs)]
    configs, udg = configs_of(jobs, hparams)
    if not configs:
        return "Time on this machine: not estimated (UDG jobs are not timed here)"
    devices = {pick_device(c.device) for c in configs}
    where = ", ".join(sorted(device_label(d) for d in devices))
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
    n = len(jobs)
    jobs_text = f"{counted} jobs" if counted == n else f"{counted} of the {n} jobs"
    left = f"; left out: {len(udg)} UDG jobs" if udg else ""
    return (f"Estimated on this machine ({where}): {format_duration(total)} for {jobs_text}, one "
            f"at a time ({'; '.join(parts)}; timed here on random images and scaled per image, "
            f"evaluation included; loading, start-up and checkpoints not counted{left})")


def main() -> int:
    """Read the request (:func:`dg_plugins.sweep.estimate.request`) on stdin, print the lines."""
    request = json.load(sys.stdin)
    sys.stdout = sys.stderr  # whatever the imports print stays off the protocol
    from dg_plugins import plugins

    plugins.load()
    cost, evaluated, measured = print_costs(request["jobs"])
    write(f"Time on this machine: not estimated ({request['remote']})" if request.get("remote")
          else machine_time(request["jobs"], cost, evaluated, measured,
                            float(request.get("budget_s", 60))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
