"""What the benchmarks share besides :mod:`benchmarks.timing`, :mod:`~benchmarks.memory` and
:mod:`~benchmarks.data`: the wall and CPU time of a child process, and random weights
under the file name of torchvision's ImageNet weights. No torch import at module import."""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time


def timed_command(command: list[str], env: dict | None = None, cwd: str | None = None):
    """Run ``command`` to completion; returns ``(wall seconds, CPU seconds of the child and its
    children, CompletedProcess)`` with stdout and stderr captured as text."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env,
                            cwd=cwd or tempfile.gettempdir())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result


def random_torchvision_weights(torch_home: str, arch: str = "resnet18", seed: int = 0) -> str:
    """Save a randomly initialised torchvision ``arch`` (seeded) as the cache file of its
    ImageNet weights (``IMAGENET1K_V1``, what ``pretrained=True`` loads) under
    ``torch_home/hub/checkpoints``; returns the file's path. A job run with
    ``TORCH_HOME=torch_home`` then starts from these random weights, offline (DomainBed's jobs
    always ask for pretrained weights)."""
    import dg_plugins.compat  # noqa: F401  (before torchvision)
    import torch
    import torchvision

    weights = torchvision.models.get_model_weights(arch).IMAGENET1K_V1
    folder = os.path.join(torch_home, "hub", "checkpoints")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, os.path.basename(weights.url))
    torch.manual_seed(seed)
    torch.save(torchvision.models.get_model(arch).state_dict(), path)
    return path
