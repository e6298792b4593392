"""The score cache: a rerun reads instead of recomputing; a changed setting or image recomputes; a
corrupt cache file is reported and recomputed, never used."""

import os
import shutil
import time
import zipfile

import numpy as np
import pytest

from dg_plugins.alignment import scoring
from dg_plugins.datasets.image_folder import PACS


def score(dataset, data_dir, model, cache_dir, **kwargs):
    kwargs.setdefault("pretrained", "none")
    return scoring.score_dataset(dataset, [0, 1], data_dir, model=model, num_workers=0,
                                 cache_dir=cache_dir, **kwargs)


def no_model(*args, **kwargs):
    raise AssertionError("the model was loaded although every score is cached")


def test_rerun_reads_the_cache_without_loading_the_model(pacs, pacs_dir, tiny_model, cache_dir,
                                                         monkeypatch):
    first = score(pacs, pacs_dir, tiny_model, cache_dir)
    n = len(first.table.frame)
    assert (first.n_computed, first.n_cached, first.cache_status) == (n, 0, "absent")
    assert os.path.exists(first.cache_path)
    monkeypatch.setattr(scoring, "load_clip", no_model)
    second = score(pacs, pacs_dir, tiny_model, cache_dir)
    assert (second.n_computed, second.n_cached, second.cache_status) == (0, n, "loaded")
    np.testing.assert_array_equal(first.table.frame["score"], second.table.frame["score"])
    # a superset of images: only the new environment is computed
    monkeypatch.undo()
    more = scoring.score_dataset(pacs, [0, 1, 2], pacs_dir, model=tiny_model, pretrained="none",
                                 num_workers=0, cache_dir=cache_dir)
    assert more.n_cached == n and more.n_computed == len(pacs[2])


@pytest.mark.parametrize("change", [{"prompt": "a sketch of a {}"}, {"seed": 1},
                                    {"transform": "clip"}])
def test_a_changed_setting_recomputes(pacs, pacs_dir, tiny_model, cache_dir, change):
    base = score(pacs, pacs_dir, tiny_model, cache_dir)
    changed = score(pacs, pacs_dir, tiny_model, cache_dir, **change)
    assert changed.n_computed == len(base.table.frame) and changed.n_cached == 0
    assert changed.cache_path != base.cache_path
    assert np.abs(changed.table.frame["score"] - base.table.frame["score"]).max() > 1e-4
    # and both settings stay cached side by side
    assert score(pacs, pacs_dir, tiny_model, cache_dir, **change).n_computed == 0
    assert score(pacs, pacs_dir, tiny_model, cache_dir).n_computed == 0


def test_a_changed_image_is_rescored(tmp_path, pacs_dir, tiny_model, cache_dir):
    shutil.copytree(os.path.join(pacs_dir, "PACS"), tmp_path / "PACS")
    dataset = PACS(str(tmp_path), [], {"data_augmentation": False})
    first = score(dataset, str(tmp_path), tiny_model, cache_dir)
    victim = dataset[0].samples[0][0]
    other = dataset[0].samples[3][0]
    time.sleep(0.01)
    shutil.copy(other, victim)  # new content (and size, mtime) under the same path
    second = score(dataset, str(tmp_path), tiny_model, cache_dir)
    assert second.n_computed == 1
    f1, f2 = first.table.frame, second.table.frame
    assert f2["score"].iloc[0] != f1["score"].iloc[0]
    np.testing.assert_array_equal(f2["score"].iloc[1:], f1["score"].iloc[1:])


def corrupt_truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def corrupt_scores(path):
    """A valid npz whose scores were altered: only the checksum can tell."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["scores"] = arrays["scores"] + np.float32(0.5)
    assert path.endswith(".npz")
    np.savez(path, **arrays)


def corrupt_garbage(path):
    with open(path, "wb") as f:
        f.write(b"not a cache file")


@pytest.mark.parametrize("corrupt", [corrupt_truncate, corrupt_scores, corrupt_garbage])
def test_a_corrupt_cache_is_reported_and_recomputed(pacs, pacs_dir, tiny_model, cache_dir, corrupt,
                                                    capsys):
    first = score(pacs, pacs_dir, tiny_model, cache_dir)
    corrupt(first.cache_path)
    capsys.readouterr()
    second = score(pacs, pacs_dir, tiny_model, cache_dir)
    err = capsys.readouterr().err
    assert second.cache_status == "corrupt"
    assert f"alignment score cache {first.cache_path} is corrupt" in err
    assert second.n_computed == len(first.table.frame) and second.n_cached == 0
    np.testing.assert_allclose(second.table.frame["score"], first.table.frame["score"], atol=1e-6)
    # rewritten valid: the next run reads it
    third = score(pacs, pacs_dir, tiny_model, cache_dir)
    assert third.cache_status == "loaded" and third.n_computed == 0
    assert zipfile.is_zipfile(first.cache_path)


def test_no_cache_option_neither_reads_nor_writes(pacs, pacs_dir, tiny_model, cache_dir):
    run = score(pacs, pacs_dir, tiny_model, cache_dir, use_cache=False)
    assert run.cache_status == "disabled" and not os.path.exists(cache_dir)
