"""The devices the suite runs on: whether CUDA is visible, the GPU lane's marker (its tests run
on CUDA and skip elsewhere, saying so), and the device a job started without ``--device`` picks
(:func:`dg_plugins.runtime.pick_device`), so that a test compares tensors or accuracies on the
device that made them."""

from __future__ import annotations

import pytest
import torch

from dg_plugins.runtime import pick_device

CUDA = torch.cuda.is_available()
#: The GPU lane (tests/gpu/): run on CUDA, skipped without a device.
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="no CUDA device visible: the GPU lane runs on a GPU machine (python -m "
    "benchmarks.gpu_check runs the whole suite there)")


def job_device() -> torch.device:
    """The device a train job without ``--device`` runs on here (CUDA when visible)."""
    return pick_device(None)


def cpu_only(env: dict) -> dict:
    """``env`` with no CUDA device visible: the processes of a test that is about the CPU."""
    return {**env, "CUDA_VISIBLE_DEVICES": ""}
