"""A job's estimated GPU-hours from the measured times (:mod:`dg_plugins.reference.gpu_times`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dg_plugins import catalog
from dg_plugins.reference import gpu_times
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.sweep.image_counts import EVAL_SPLITS
from dg_plugins.job.flags import compute_settings


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
    match = re.match(r"(vit|deit)_(tiny|small|base|large|huge)_patch(\d+)", arch)
    if not match:
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
    """The estimated GPU seconds of the job of train args ``a`` from its images and forwards."""
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
