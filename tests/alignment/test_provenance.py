"""A score file is used only for what it was made for: the copy of the data it scored, the model a
rule is defined for, cosines in [-1, 1], and a text file at all; each refusal names the file, what
differs and the fix."""

import json
import shutil

import numpy as np
import pytest

from dg_plugins.alignment import read_scores, write_scores
from dg_plugins.alignment.provenance import FINGERPRINT_KEY
from dg_plugins.alignment.wrapper import env_subsets
from dg_plugins.datasets.image_folder import PACS
from dg_plugins.scripts import alignment_eval

from alignment_helpers import fake_table
from support.image_tree import make_pacs_tree
from support.processes import command_env, run

TIMEOUT = 120


def pacs_of(data_dir):
    return PACS(str(data_dir), [], {"data_augmentation": False})


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory):
    """A PACS tree, its score file, and a second copy of the tree in which one image of env 0
    was re-encoded (other bytes, same path and class)."""
    root = tmp_path_factory.mktemp("copies")
    first = make_pacs_tree(root / "first")
    table = fake_table(pacs_of(first), first)
    scores = root / "first_scores.csv"
    write_scores(str(scores), table.frame, table.meta)
    second = root / "second"
    shutil.copytree(first, second)
    image = sorted((second / "PACS" / "art_painting" / "dog").iterdir())[0]
    from PIL import Image

    Image.open(image).convert("RGB").save(image, quality=50)  # re-encoded: another byte size
    return {"first": first, "second": second, "scores": str(scores)}


def test_a_file_follows_its_data_copy_but_not_another_one(two_copies, tmp_path):
    scores = two_copies["scores"]
    assert FINGERPRINT_KEY in read_scores(scores).meta
    # the same images moved elsewhere (paths relative to data_dir, byte sizes kept): accepted
    moved = tmp_path / "moved"
    shutil.copytree(two_copies["first"], moved)
    assert env_subsets(pacs_of(moved), [0, 1], scores, 0.25, data_dir=str(moved))[0]["ip"]
    # another copy: env 1 is the same files, env 0 holds a re-encoded image
    other = two_copies["second"]
    assert env_subsets(pacs_of(other), [1], scores, 0.25, data_dir=str(other))
    with pytest.raises(ValueError) as err:
        env_subsets(pacs_of(other), [0, 1], scores, 0.25, data_dir=str(other))
    message = str(err.value)
    assert scores in message and "another copy of the data" in message
    assert "environment 0 (art_painting)" in message and str(other) in message
    assert f"--data_dir {other}" in message and "alignment_scores" in message


def test_an_old_file_without_fingerprints_is_read_with_a_warning(two_copies, tmp_path, capsys):
    table = read_scores(two_copies["scores"])
    del table.meta[FINGERPRINT_KEY]
    old = str(tmp_path / "old.csv")
    write_scores(old, table.frame, table.meta)
    first = two_copies["first"]
    subsets = env_subsets(pacs_of(first), [0, 2], old, 0.25, data_dir=str(first))
    assert set(subsets) == {0, 2}
    err = capsys.readouterr().err
    assert err.count("no data fingerprint") == 1 and old in err and "re-score" in err


def test_train_rejects_a_file_of_another_data_copy(two_copies, tmp_path):
    """As a user runs it: train's default workers, a subprocess under a timeout; the job stops
    before training with the one-line error."""
    hparams = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                          "pretrained": False, "batch_size": 4, "image_size": 32})
    code, output = run("dg_plugins.scripts.train", "--dataset", "PACS", "--data_dir",
                       two_copies["second"], "--algorithm", "ERM", "--test_envs", "0",
                       "--steps", "2", "--hparams", hparams, "--alignment_scores",
                       two_copies["scores"], "--output_dir", tmp_path / "job",
                       env=command_env(), timeout=TIMEOUT)
    assert code != 0, output
    line = next(x for x in output.splitlines() if x.startswith("error:"))
    assert two_copies["scores"] in line and "another copy of the data" in line
    assert not (tmp_path / "job" / "results.jsonl").exists()


def retag(path, out, **meta):
    table = read_scores(path)
    table.meta.update(meta)
    write_scores(str(out), table.frame, table.meta)
    return str(out)


def test_a_rule_defined_for_one_model_rejects_another(pacs, pacs_dir, scores_file, tmp_path):
    assert env_subsets(pacs, [0], scores_file, preset="teterwak2025", data_dir=pacs_dir)
    other = retag(scores_file, tmp_path / "b32.csv", model="ViT-B-32",
                  pretrained="laion2b_s34b_b79k")
    with pytest.raises(ValueError) as err:
        env_subsets(pacs, [0], other, preset="teterwak2025", data_dir=pacs_dir)
    message = str(err.value)
    assert other in message and "--alignment_preset teterwak2025" in message
    assert "ViT-B-16 / laion400m_e32" in message and "ViT-B-32 / laion2b_s34b_b79k" in message
    assert "--model ViT-B-16 --pretrained laion400m_e32" in message
    # a plain threshold is defined for no model: the same file is accepted
    assert env_subsets(pacs, [0], other, threshold=0.25, data_dir=pacs_dir)
    # a local checkpoint: rejected unless declared to hold the tag's weights
    checkpoint = retag(scores_file, tmp_path / "ckpt.csv", pretrained="/w/model.bin",
                       pretrained_sha256="ab" * 32)
    with pytest.raises(ValueError, match="not declared to hold those weights.*--pretrained_tag "
                                         "laion400m_e32"):
        env_subsets(pacs, [0], checkpoint, preset="teterwak2025", data_dir=pacs_dir)
    declared = retag(checkpoint, tmp_path / "declared.csv", pretrained_tag="laion400m_e32")
    assert env_subsets(pacs, [0], declared, preset="teterwak2025", data_dir=pacs_dir)
    random = retag(scores_file, tmp_path / "random.csv", pretrained="none")
    with pytest.raises(ValueError, match="scored by ViT-B-16 / none"):
        env_subsets(pacs, [0], random, preset="teterwak2025", data_dir=pacs_dir)


def test_alignment_eval_checks_an_explicit_model(scores_file, tmp_path, capsys):
    """Checked before any job is read (the job folder does not even exist)."""
    job = str(tmp_path / "no_job")
    assert alignment_eval.main([job, "--alignment_scores", scores_file,
                                "--alignment_model", "ViT-L-14"]) == 2
    err = capsys.readouterr().err
    assert scores_file in err and "needs scores of ViT-L-14" in err
    assert alignment_eval.main([job, "--alignment_scores", scores_file, "--alignment_model",
                                "ViT-B/16", "--alignment_pretrained", "openai"]) == 2
    assert "needs scores of ViT-B/16 / openai" in capsys.readouterr().err
    # the right model passes the check and goes on to the (missing) job
    assert alignment_eval.main([job, "--alignment_scores", scores_file, "--alignment_model",
                                "ViT-B-16", "--alignment_pretrained", "laion400m_e32"]) == 2
    assert "no model.pkl" in capsys.readouterr().err


def test_scores_outside_minus_one_one_are_rejected_with_their_lines(scores_file, tmp_path):
    lines = open(scores_file).read().splitlines()
    first_row = next(i for i, line in enumerate(lines) if line.startswith("env,")) + 1
    for offset, value in ((2, "1.5"), (7, "-3"), (9, "inf")):
        fields = lines[first_row + offset].split(",")
        fields[5] = value
        lines[first_row + offset] = ",".join(fields)
    edited = tmp_path / "edited.csv"
    edited.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as err:
        read_scores(str(edited))
    message = str(err.value)
    assert str(edited) in message and "3 scores lie outside [-1, 1]" in message
    for offset, value in ((2, "1.5"), (7, "-3.0"), (9, "inf")):
        number = first_row + offset + 1  # 1-based file line
        assert f"line {number}: {value}" in message
        assert lines[number - 1].endswith(value.replace("-3.0", "-3"))
    # float32 rounding of a perfect cosine is still a cosine
    lines[first_row] = ",".join(lines[first_row].split(",")[:5] + ["1.0000001"])
    edited.write_text("\n".join(l for i, l in enumerate(lines)
                                if i not in (first_row + 2, first_row + 7, first_row + 9)) + "\n")
    assert read_scores(str(edited)).frame["score"].max() == pytest.approx(1.0000001)


@pytest.mark.parametrize("kind", ["npy", "png", "random"])
def test_a_binary_file_is_named_and_explained(tmp_path, kind):
    path = tmp_path / f"scores.{kind}"
    if kind == "npy":
        np.save(path, np.zeros((3, 2)))
        path = tmp_path / "scores.npy"
    elif kind == "png":
        from PIL import Image

        Image.new("RGB", (8, 8)).save(path, format="PNG")
    else:
        path.write_bytes(bytes(range(128, 256)) * 4)  # no NUL, not UTF-8
    with pytest.raises(ValueError) as err:
        read_scores(str(path))
    message = str(err.value)
    assert str(path) in message and "is not a score file" in message
    assert "a score file is the text CSV written by" in message and "alignment_scores" in message
    if kind == "npy":
        assert "--import_score_arrays" in message
