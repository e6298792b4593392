"""Importing the authors' released splits, on files generated here in the documented formats (the
real release could not be downloaded: see dg_plugins.alignment.wrapper)."""

import os

import numpy as np
import pytest

from dg_plugins.alignment import env_subsets, read_scores, write_scores
from dg_plugins.alignment.wrapper import import_score_arrays, import_split_dirs
from dg_plugins.scripts import alignment_scores
from dg_plugins.seeds import seed_hash


def write_authors_arrays(folder, dataset, scores_by_env, holdout=0.2, trial_seed=0):
    """What the authors' evaluator dumps: <domain>_<in|out>.npy, rows (score, is_correct) in the
    order of the split's items; the split shuffles a list of keys as DomainBed does."""
    os.makedirs(folder, exist_ok=True)
    for env, scores in scores_by_env.items():
        keys = list(range(len(scores)))
        np.random.RandomState(seed_hash(trial_seed, env)).shuffle(keys)
        n_out = int(len(keys) * holdout)
        name = os.path.basename(dataset[env].root)
        for split, part in (("out", keys[:n_out]), ("in", keys[n_out:])):
            rows = [(scores[k], float(k % 2)) for k in part]
            np.save(os.path.join(folder, f"{name}_{split}.npy"), np.asarray(rows))


def test_score_arrays_land_on_their_images(tmp_path, pacs, pacs_dir):
    rng = np.random.default_rng(0)
    truth = {env: rng.uniform(0.1, 0.4, len(pacs[env])) for env in (0, 2)}
    write_authors_arrays(tmp_path / "clipscores", pacs, truth)
    table = import_score_arrays(pacs, str(tmp_path / "clipscores"), pacs_dir)
    assert sorted(set(table.frame["env"])) == [0, 2]
    for env, scores in truth.items():
        part = table.frame[table.frame["env"] == env]
        np.testing.assert_allclose(part["score"], scores)
        assert list(part["reference_correct"]) == [float(k % 2) for k in range(len(scores))]
    assert table.meta["model"] == "ViT-B-16" and "holdout_fraction 0.2" in table.meta["source"]
    path = str(tmp_path / "imported.csv")
    write_scores(path, table.frame, table.meta)
    subsets = env_subsets(pacs, [0], path, threshold=0.25, data_dir=pacs_dir)
    assert subsets[0]["ip"] == np.flatnonzero(truth[0] >= 0.25).tolist()


def test_score_arrays_of_another_split_are_rejected(tmp_path, pacs, pacs_dir):
    write_authors_arrays(tmp_path / "a", pacs, {0: np.full(len(pacs[0]), 0.2)}, holdout=0.3)
    with pytest.raises(ValueError, match="rows but the in split of environment 0"):
        import_score_arrays(pacs, str(tmp_path / "a"), pacs_dir)
    os.remove(tmp_path / "a" / "art_painting_out.npy")
    with pytest.raises(FileNotFoundError, match="art_painting_out.npy is missing"):
        import_score_arrays(pacs, str(tmp_path / "a"), pacs_dir)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no <domain>_in.npy"):
        import_score_arrays(pacs, str(tmp_path / "empty"), pacs_dir)


def make_split_copy(root, pacs, pacs_dir, chosen):
    """A copy of the dataset in DomainBed's layout holding only ``chosen`` (env, index) images."""
    for env, index in chosen:
        source = pacs[env].samples[index][0]
        target = os.path.join(root, os.path.relpath(source, pacs_dir))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(source, target)


def test_split_folders_give_fixed_subsets(tmp_path, pacs, pacs_dir, capsys):
    ip = [(0, i) for i in range(0, 6)] + [(1, 0)]
    oop = [(0, i) for i in range(6, 9)] + [(1, i) for i in range(1, len(pacs[1]))]
    make_split_copy(tmp_path / "easy", pacs, pacs_dir, ip)
    make_split_copy(tmp_path / "hard", pacs, pacs_dir, oop)
    table = import_split_dirs(pacs, str(tmp_path / "easy"), str(tmp_path / "hard"), pacs_dir)
    assert sorted(set(table.frame["env"])) == [0, 1]
    env0 = table.frame[table.frame["env"] == 0]
    assert list(env0["subset"]) == ["ip"] * 6 + ["oop"] * 3 + ["drop"]
    path = str(tmp_path / "fixed.csv")
    write_scores(path, table.frame, table.meta)
    subsets = env_subsets(pacs, [0, 1], path, data_dir=pacs_dir)
    assert subsets[0] == {"ip": list(range(6)), "oop": [6, 7, 8]}
    assert subsets[1] == {"ip": [0], "oop": list(range(1, len(pacs[1])))}
    assert "fixed subsets from imported split folders" in capsys.readouterr().out
    # the dataset folder itself works as well as the data_dir holding it
    again = import_split_dirs(pacs, str(tmp_path / "easy" / "PACS"),
                              str(tmp_path / "hard" / "PACS"), pacs_dir)
    assert list(again.frame["subset"]) == list(table.frame["subset"])
    # an image in both copies is an error
    make_split_copy(tmp_path / "hard", pacs, pacs_dir, [(0, 0)])
    with pytest.raises(ValueError, match="in both the IP and the OOP folder"):
        import_split_dirs(pacs, str(tmp_path / "easy"), str(tmp_path / "hard"), pacs_dir)


def test_cli_imports_and_reports(tmp_path, pacs, pacs_dir, capsys):
    write_authors_arrays(tmp_path / "clipscores", pacs,
                         {env: np.linspace(0.1, 0.45, len(pacs[env])) for env in range(4)})
    out = str(tmp_path / "imported.csv")
    assert alignment_scores.main(["--dataset", "PACS", "--data_dir", pacs_dir,
                                  "--import_score_arrays", str(tmp_path / "clipscores"),
                                  "--alignment_preset", "teterwak2025", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 40 rows to {out}" in printed and "IP if score >= 0.21" in printed
    assert len(read_scores(out).frame) == 40
