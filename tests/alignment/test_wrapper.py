"""The dataset wrapper and env_subsets: partitions of each target environment, and clear errors
for a score file that does not match the dataset."""

import os
import shutil

import numpy as np
import pandas as pd
import pytest

from dg_plugins.alignment import (AlignmentSplit, env_subsets, read_scores, resolve_rule,
                                  write_scores)
from dg_plugins.datasets.image_folder import PACS

from alignment_helpers import fake_score, fake_table


def test_indices_partition_each_target_env(pacs, pacs_dir, scores_file):
    rule = resolve_rule(preset="teterwak2025")
    split = AlignmentSplit(pacs, scores_file, [0, 1, 2, 3], rule, data_dir=pacs_dir)
    total_dropped = 0
    for env in range(4):
        ip, oop, drop = (split.indices(env, s) for s in ("ip", "oop", "drop"))
        assert sorted(ip + oop + drop) == list(range(len(pacs[env])))
        assert not set(ip) & set(oop) and not set(drop) & (set(ip) | set(oop))
        for index in range(len(pacs[env])):  # each item's subset follows its own score
            path = os.path.relpath(pacs[env].samples[index][0], pacs_dir)
            expected = rule.assign([np.float32(fake_score(path))])[0]
            assert index in {"ip": ip, "oop": oop, "drop": drop}[expected]
        total_dropped += len(drop)
        view = split.subset(env, "ip")
        assert len(view) == len(ip) and view.indices == ip
    assert total_dropped > 0  # the fixture's scores reach below 0.15 and above 0.40
    subsets = env_subsets(pacs, [1, 3], scores_file, preset="teterwak2025", data_dir=pacs_dir)
    assert set(subsets) == {1, 3}
    for env in (1, 3):
        assert subsets[env] == {"ip": split.indices(env, "ip"), "oop": split.indices(env, "oop")}


def test_env_subsets_default_rule_and_report(pacs, pacs_dir, scores_file, capsys):
    subsets = env_subsets(pacs, [0], scores_file, data_dir=pacs_dir)
    assert sorted(subsets[0]["ip"] + subsets[0]["oop"]) == list(range(len(pacs[0])))
    table = read_scores(scores_file).frame
    scores = table[table["env"] == 0]["score"].to_numpy()
    assert len(subsets[0]["ip"]) == int((scores >= 0.4).sum())
    out = capsys.readouterr().out
    assert "IP if score >= 0.4" in out and "art_painting" in out and "%" in out


def test_paths_match_without_data_dir_and_on_a_moved_copy(tmp_path, pacs, pacs_dir, scores_file):
    reference = env_subsets(pacs, [0, 2], scores_file, threshold=0.25, data_dir=pacs_dir)
    assert env_subsets(pacs, [0, 2], scores_file, threshold=0.25) == reference
    shutil.copytree(os.path.join(pacs_dir, "PACS"), tmp_path / "elsewhere" / "PACS")
    moved = PACS(str(tmp_path / "elsewhere"), [], {"data_augmentation": False})
    assert env_subsets(moved, [0, 2], scores_file, threshold=0.25,
                       data_dir=str(tmp_path / "elsewhere")) == reference


def edited(scores_file, tmp_path, edit):
    table = read_scores(scores_file)
    frame = edit(table.frame.copy())
    path = str(tmp_path / "edited.csv")
    write_scores(path, frame, table.meta)
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.drop(index=f.index[f["env"] == 0][3]), "1 of the 10 images of environment 0 "
                                                          r"\(art_painting\) have no score"),
    (lambda f: f[f["env"] != 0], "no scores for environment 0"),
    (lambda f: f.assign(env_name=f["env_name"].where(f["env"] != 0, "clipart")),
     "environment 0 is \\['clipart'\\] in the file but 'art_painting'"),
    (lambda f: f.assign(**{"class": f["class"].where(f.index != 2, "giraffe")}),
     "another class than in the dataset"),
    (lambda f: f.assign(path=f["path"].where(f.index != 1, "PACS/art_painting/dog/new.jpg")),
     "have no score"),
])
def test_a_mismatched_score_file_raises(tmp_path, pacs, pacs_dir, scores_file, edit, message):
    path = edited(scores_file, tmp_path, edit)
    with pytest.raises(ValueError, match=message):
        env_subsets(pacs, [0], path, data_dir=pacs_dir)


def test_extra_scored_images_raise(tmp_path, pacs, pacs_dir, scores_file):
    def add_row(f):
        row = f[f["env"] == 0].iloc[[0]].assign(path="PACS/art_painting/dog/gone.jpg")
        return pd.concat([f, row], ignore_index=True)
    path = edited(scores_file, tmp_path, add_row)
    with pytest.raises(ValueError, match="1 scored images of environment 0 .* are not in the "
                                         "dataset"):
        env_subsets(pacs, [0], path, data_dir=pacs_dir)


def test_bad_datasets_and_rules_raise(pacs, pacs_dir, scores_file, tmp_path):
    from dg_plugins.datasets.debug import Debug28

    with pytest.raises(ValueError, match="no image paths"):
        env_subsets(Debug28(None, [], {}), [0], scores_file)
    with pytest.raises(ValueError, match="unknown alignment preset"):
        env_subsets(pacs, [0], scores_file, preset="nope", data_dir=pacs_dir)
    with pytest.raises(ValueError, match="sets its own threshold"):
        env_subsets(pacs, [0], scores_file, threshold=0.3, preset="teterwak2025")
    table = read_scores(scores_file)
    fixed = table.frame.assign(subset="ip", score=np.nan)
    path = str(tmp_path / "fixed.csv")
    write_scores(path, fixed, table.meta)
    assert env_subsets(pacs, [0], path)[0]["ip"] == list(range(len(pacs[0])))
    with pytest.raises(ValueError, match="fixed IP/OOP subsets"):
        env_subsets(pacs, [0], path, threshold=0.3)
    with pytest.raises(FileNotFoundError, match="alignment_scores"):
        env_subsets(pacs, [0], str(tmp_path / "missing.csv"))


def test_score_file_round_trip_and_header(pacs, pacs_dir, tmp_path):
    table = fake_table(pacs, pacs_dir)
    table.meta["prompt"] = 'A "quoted" {}: prompt'
    path = str(tmp_path / "s.csv")
    write_scores(path, table.frame, table.meta)
    text = open(path).read().splitlines()
    assert text[0] == "# dg_plugins alignment scores v1"
    assert "env,env_name,path,label,class,score" in text
    back = read_scores(path)
    assert back.meta == table.meta
    for column in ("env", "env_name", "path", "label", "class"):
        assert list(back.frame[column]) == list(table.frame[column])
    np.testing.assert_array_equal(back.frame["score"].to_numpy(np.float32),
                                  table.frame["score"].to_numpy(np.float32))


def test_domainbed_datasets_through_the_bridge(pacs_dir, scores_file):
    """DomainBed's own PACS (per-domain ImageFolder: in the sketch domain, which lacks 'person',
    'house' gets index 5) matches our score file by class name."""
    if not os.environ.get("DOMAINBED_ROOT"):
        pytest.skip("set DOMAINBED_ROOT to a DomainBed checkout to test DomainBed's datasets")
    from dg_plugins.domainbed import bridge

    domainbed = bridge.locate_domainbed()
    import importlib

    datasets = importlib.import_module(f"{domainbed.__name__}.datasets")
    theirs = datasets.PACS(pacs_dir, [3], {"data_augmentation": False})
    ours = PACS(pacs_dir, [], {"data_augmentation": False})
    assert theirs[3].classes != ours.classes  # the index shift of DomainBed's ImageFolder
    for env in range(4):
        assert [p for p, _ in theirs[env].samples] == [p for p, _ in ours[env].samples]
    assert env_subsets(theirs, [0, 3], scores_file, threshold=0.25) == env_subsets(
        ours, [0, 3], scores_file, threshold=0.25)
    split = AlignmentSplit(theirs, scores_file, [3], resolve_rule(0.25))
    assert len(split.subset(3, "ip")) == len(split.indices(3, "ip"))
