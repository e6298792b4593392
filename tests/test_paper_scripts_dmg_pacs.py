"""``sweeps/dmg_pacs_paper.sh`` run as a user runs it, end to end, on PACS shaped like its
release (the 42-file sample with the official split lists, whose test lists hold every image):
the default protocol (release: official splits, epoch lengths) and PROTOCOL=domainbed, each
shrunk only through the script's knobs (one held-out domain, one trial, one epoch or step, random
init, 32x32 images in HPARAMS), with the local launcher and default loader workers. Each run ends
with its tables and the paper's rows. Then ``reproduce dmg_pacs --describe`` is read against what
the release run computed: its hparams, its length, its selection, and what the target accuracy
and the oracle column are computed on (the saved model is evaluated here on the lists
themselves)."""

from __future__ import annotations

import ast
import json
import math
import re

import pytest

from support.devices import job_device
from support.paper_runs import assert_reproduced, job_folders, run_script
from support import release_data

TIMEOUT_S = 400
#: Random init, and the images resized to 32x32 (the ResNets' 224x224 is most of a run's CPU).
HPARAMS = '{"pretrained": false, "image_size": 32}'


@pytest.fixture(scope="module")
def pacs_dir(tmp_path_factory):
    return release_data.pacs(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def runs(pacs_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dmg_pacs")
    return {
        # the release protocol: DMG (the paper's method) with target art_painting, 1 epoch
        "release": run_script("dmg_pacs_paper.sh", tmp, pacs_dir, tag="default", timeout=TIMEOUT_S,
                              ALGORITHMS="DMG", TEST_ENVS="0", EPOCHS="1", N_TRIALS="1",
                              HPARAMS=HPARAMS),
        # DomainBed's protocol: the Aggregate* baseline (ERM), target sketch, 1 step of 4 images
        # per domain (the table's 21 would draw each source's 8 images several times)
        "domainbed": run_script("dmg_pacs_paper.sh", tmp, pacs_dir, tag="domainbed",
                                timeout=TIMEOUT_S, PROTOCOL="domainbed", ALGORITHMS="ERM",
                                TEST_ENVS="3", STEPS="1", N_TRIALS="1",
                                HPARAMS='{"pretrained": false, "batch_size": 4, "image_size": 32}'),
    }


def test_release_protocol_trains_on_the_official_lists_and_prints_the_paper_rows(runs, pacs_dir):
    run = runs["release"]
    assert_reproduced(run, "dmg_pacs", "release", ["DMG"], n_jobs=2)
    # the steps of an epoch come from the lists on disk: 3 sources x 6 training images / 64
    assert "18 training images (6+6+6; official split lists counted in " \
        f"{pacs_dir / 'PACS'})" in run.stdout


def test_domainbed_protocol_trains_and_prints_the_paper_rows(runs):
    sections = assert_reproduced(runs["domainbed"], "dmg_pacs", "domainbed", ["ERM"], n_jobs=2)
    assert all("test-domain validation set (oracle)" in text for text in sections.values())


def describe_rows(text: str) -> dict[str, dict[str, object]]:
    """``--describe`` text -> {section: {name: value}}; sections: "" (the protocol),
    "group <folder>", "run <algorithms>"."""
    rows, section = {"": {}}, ""
    for line in text.splitlines():
        heading = re.match(r"  (group \S+|run [^:]+)", line)
        if heading and not line.startswith("    "):
            section = heading.group(1)
            rows[section] = {}
            continue
        match = re.match(r"  ( {4})?(\S+) = (.*?)  \[", line)
        if match:
            try:
                value = ast.literal_eval(match.group(3))
            except (ValueError, SyntaxError):  # words ("one epoch")
                value = match.group(3)
            rows[section if match.group(1) else ""][match.group(2)] = value
    return rows


def read_list(path):
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def list_accuracy(algorithm, root, lines, size) -> float:
    """The accuracy of ``algorithm`` on the images a split list names (its labels count from 1),
    read here with the datasets' evaluation transform at ``size`` x ``size``."""
    import torch
    from PIL import Image

    from dg_plugins.datasets.image_folder import plain_transform

    transform = plain_transform(size)
    device = job_device()  # the job's own (CUDA where visible): the same kernels
    x = torch.stack([transform(Image.open(root / path).convert("RGB")) for path, _ in lines])
    y = torch.tensor([int(label) - 1 for _, label in lines])
    with torch.no_grad():
        predicted = algorithm.to(device).predict(x.to(device)).argmax(1).cpu()
    return (predicted == y).float().mean().item()


def test_describe_says_what_the_release_run_computed(runs, pacs_dir, capsys):
    """The --describe text (as printed, here by the command called in this process, and as the run
    recorded it beside its sweeps) against the release run: the DMG run's and the ResNet-18
    folder's hparams are the job's (but the HPARAMS knob's: random init, 32x32 images), one
    checkpoint per epoch of the official training lists, training-domain validation only; and, as
    its 'Oracle column' entry says, the target's env0_in_acc is the accuracy on its whole test list
    (every image of art_painting) and env0_out_acc, which the oracle selects on, the accuracy on
    its crossval list, a subset of that test list."""
    import torch

    import dg_plugins.algorithms  # noqa: F401  (registers the algorithms)
    from dg_plugins.registry import ALGORITHMS
    from dg_plugins.reproduce import cli as reproduce_cli

    run = runs["release"]
    assert run.returncode == 0, run.report()
    capsys.readouterr()
    assert reproduce_cli.main(["dmg_pacs", "--describe"]) == 0  # the text is the subject
    described = capsys.readouterr().out
    recorded = (run.output_dir / "release" / "reproduce.txt").read_text()
    assert described in recorded
    rows = describe_rows(described)
    oracle = next(line for line in described.splitlines() if "Oracle column" in line)
    assert "env{t}_in_acc is the whole test list" in oracle
    assert "its crossval list, a subset of its test list" in oracle

    (job,) = [j for j in job_folders(run.output_dir / "release" / "resnet18")]
    record = json.loads((job / "results.jsonl").read_text().splitlines()[-1])
    hparams, args = record["hparams"], record["args"]
    expected = {**rows["group resnet18"], **rows["run DMG"], "pretrained": False,
                "image_size": 32}  # the knob
    assert {name: hparams[name] for name in expected} == expected
    assert args["test_envs"] == [0] and args["algorithm"] == "DMG"
    # one epoch of the sources' official training lists, pooled, a checkpoint per epoch
    root = pacs_dir / "PACS"
    sources = ("cartoon", "photo", "sketch")
    per_epoch = math.ceil(sum(len(read_list(root / f"{d}_train_kfold.txt")) for d in sources)
                          / expected["batch_size"])
    assert rows[""]["epochs"] == 150
    assert (args["steps"], args["checkpoint_freq"]) == (1 * per_epoch, per_epoch)
    assert rows[""]["selection"] == ("iid",)
    tables = run.stdout.split("collect_results --input_dir")[1]
    assert "training-domain validation set" in tables and "(oracle)" not in tables

    # what env0_in_acc / env0_out_acc are computed on
    test, crossval = (read_list(root / f"art_painting_{kind}_kfold.txt")
                      for kind in ("test", "crossval"))
    images = sorted(p.relative_to(root).as_posix() for p in (root / "art_painting").rglob("*.jpg"))
    assert sorted(path for path, _ in test) == images  # the test list is the whole domain
    assert {path for path, _ in crossval} < {path for path, _ in test}
    sizes = re.search(r"env0 uses the dataset's predefined split \((\d+) in, (\d+) out\)",
                      (job / "out.txt").read_text())
    assert sizes and (int(sizes.group(1)), int(sizes.group(2))) == (len(test), len(crossval))
    saved = torch.load(job / "model.pkl", weights_only=False)
    algorithm = ALGORITHMS.get("DMG")(saved["model_input_shape"], saved["model_num_classes"],
                                      saved["model_num_domains"], saved["model_hparams"])
    algorithm.load_state_dict(saved["model_dict"])
    algorithm.eval()
    size = hparams["image_size"]
    assert list_accuracy(algorithm, root, test, size) == pytest.approx(record["env0_in_acc"])
    assert list_accuracy(algorithm, root, crossval, size) == pytest.approx(record["env0_out_acc"])
    # a source's validation accuracy is its crossval list's
    cartoon = read_list(root / "cartoon_crossval_kfold.txt")
    assert list_accuracy(algorithm, root, cartoon, size) == pytest.approx(record["env1_out_acc"])
