"""Shared test setup: offline hub, CPU, tiny backbones."""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hub look-ups fail at once instead of retrying
os.environ.setdefault("DG_PLUGINS_OFFLINE", "1")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
sys.path.insert(0, str(REPO / "tests"))  # test-only helper modules (e.g. plugin algorithms)


def tiny_hparams(algorithm: str, dataset: str, **overrides) -> dict:
    """Default hparams made CPU-sized: random-init backbones, ResNet-18 for 224x224 inputs,
    batch 8, plus the algorithm's own ``TINY_TEST_HPARAMS`` (e.g. a tiny ViT)."""
    from dg_plugins import hparams
    from dg_plugins.registry import ALGORITHMS

    hp = hparams.default_hparams(algorithm, dataset)
    hp.update(pretrained=False, resnet18=True, resnet50_augmix=False, batch_size=8)
    hp.update(getattr(ALGORITHMS.get(algorithm), "TINY_TEST_HPARAMS", {}))
    hp.update(overrides)
    return hp


@pytest.fixture
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"shared fixtures not found at {SHARED_FIXTURES}")
    return SHARED_FIXTURES
