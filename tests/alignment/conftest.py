"""Shared fixtures of the IP/OOP tests: the 42-file PACS fixture (40 images), a tiny random
open_clip model registered from a config file, and precomputed score files."""

import json
from pathlib import Path

import pytest

from alignment_helpers import TINY_CONFIG, TINY_MODEL, fake_table


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The name of the tiny open_clip model, registered from a JSON config file."""
    from dg_plugins.alignment import scoring

    path = tmp_path_factory.mktemp("clip_config") / f"{TINY_MODEL}.json"
    path.write_text(json.dumps(TINY_CONFIG))
    assert scoring.add_model_config(str(path)) == TINY_MODEL
    return TINY_MODEL


@pytest.fixture(scope="session")
def pacs_dir():
    folder = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "pacs_mini"
    if not (folder / "PACS").is_dir():
        pytest.skip(f"PACS fixture not found at {folder}")
    return str(folder)


@pytest.fixture(scope="session")
def pacs(pacs_dir):
    from dg_plugins.datasets.image_folder import PACS

    return PACS(pacs_dir, [], {"data_augmentation": False})


@pytest.fixture(scope="session")
def scores_file(pacs, pacs_dir, tmp_path_factory):
    from dg_plugins.alignment import write_scores

    table = fake_table(pacs, pacs_dir)
    path = tmp_path_factory.mktemp("scores") / "pacs_mini_scores.csv"
    write_scores(str(path), table.frame, table.meta)
    return str(path)


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Run these tests' tiny models on one intra-op thread, restored afterwards: on a shared,
    loaded 2-core machine, two OpenMP threads spin-waiting for each other made them ~6x slower
    (330 s instead of 50 s for this folder), and tiny models gain nothing from a second thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
