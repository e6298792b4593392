"""Measured GPU times behind the GPU-hours estimates of ``reproduce`` (dry runs, ``--list
--forwards``): the training step time per algorithm and network, and the evaluation throughput,
as ``benchmark gpu`` measured them (``results/gpu_benchmarks.md``). Torch-free: the JSON file
``gpu_step_times.json`` beside this module names its device, date and commands; :func:`load`
reads and checks it."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache

#: The JSON file shipped with the package (``setup.cfg`` lists it as package data).
GPU_TIMES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_step_times.json")


class GpuTimesError(ValueError):
    """The GPU times file is missing, not JSON, or malformed."""


@dataclass(frozen=True)
class GpuTimes:
    device: str  # e.g. "NVIDIA H200"
    device_detail: str
    date: str
    file: str  # the results file the numbers come from
    step_ms: dict  # "ALGORITHM NETWORK" -> ms of a measured step
    batch_per_domain: int  # a measured step: batch_per_domain x source_domains images
    source_domains: int
    train_precision: str
    eval_images_per_second: float
    eval_algorithm: str  # what evaluation was measured with
    eval_workers: int
    input_size: int  # the image size steps and evaluation were measured at

    @property
    def images_per_step(self) -> int:
        return self.batch_per_domain * self.source_domains

    def seconds_per_training_image(self, label: str) -> float | None:
        """The measured step time of ``label`` ("ERM ResNet-50") per image of the step (the
        estimate scales a step by its images); None when it was not measured."""
        ms = self.step_ms.get(label)
        return None if ms is None else ms / 1000 / self.images_per_step

    def source(self) -> str:
        return f"benchmark gpu on {self.device_detail}; {self.date} ({self.file})"


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise GpuTimesError(f"{GPU_TIMES_FILE}: {where} must be a positive number, got {value!r}")
    return float(value)


@lru_cache(maxsize=None)
def load(path: str = GPU_TIMES_FILE) -> GpuTimes:
    """The measured times of ``path``; raises :class:`GpuTimesError` naming the bad field."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        source, train, evaluation = data["source"], data["train_step"], data["evaluation"]

        def number(section: str, key: str) -> float:
            return _number(data[section][key], f"{section}.{key}")

        return GpuTimes(
            **{key: str(source[key]) for key in ("device", "device_detail", "date", "file")},
            step_ms={str(k): _number(v, f"train_step.ms[{k!r}]") for k, v in train["ms"].items()},
            batch_per_domain=int(number("train_step", "batch_per_domain")),
            source_domains=int(number("train_step", "source_domains")),
            train_precision=str(train["precision"]),
            eval_images_per_second=number("evaluation", "images_per_second"),
            eval_algorithm=str(evaluation["algorithm"]),
            eval_workers=int(number("evaluation", "loader_workers")),
            input_size=int(number("train_step", "input_size")))
    except GpuTimesError:
        raise
    except (OSError, ValueError) as err:
        raise GpuTimesError(f"cannot read {path}: {err}") from None
    except (KeyError, TypeError, AttributeError) as err:
        raise GpuTimesError(f"{path}: missing or malformed field {err}") from None
