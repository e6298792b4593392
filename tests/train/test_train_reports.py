"""What train tells a user while a job runs: the weights the model took and where from (a cache
file, a local file, random initialisation), the measured step time with the estimate of the job's
time, and, when the output is not a terminal, a progress line every ``--progress_every`` seconds
(default 60), else a progress bar. Run as a user runs it: a subprocess (on an image tree with the
default loader workers where the weights matter)."""

import json

import pytest
import torch

from dg_plugins.train.progress import DEFAULT_INTERVAL_S, TIMED_STEPS, Progress, format_duration
from support.image_tree import make_pacs_tree
from support.processes import command_env, run

TRAIN = "dg_plugins.scripts.train"
TIMEOUT = 180


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_pacs_tree(tmp_path_factory.mktemp("pacs_tree"), per_class=1, size=16)


def train(tree, out, hparams, *extra, env=None):
    return run(TRAIN, "--dataset", "PACS", "--data_dir", tree, "--test_envs", "0", "--hparams",
               json.dumps({"batch_size": 2, "resnet18": True, **hparams}), "--output_dir", out,
               *extra, env=env or command_env(), timeout=TIMEOUT)


@pytest.fixture(scope="module")
def cached_job(tree, tmp_path_factory):
    """The real command on a ResNet-18 job (1 step) whose ImageNet weights are found in
    torch.hub's cache (a ResNet-18 state dict filed under the release's name): its folder,
    output and the cache file."""
    import dg_plugins.compat  # noqa: F401  (before torchvision)
    import torchvision

    root = tmp_path_factory.mktemp("cached")
    torch_home = root / "torch"
    cached = torch_home / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    torch.save(torchvision.models.resnet18().state_dict(), cached)
    code, output = train(tree, root / "job", {}, "--steps", "1", "--skip_model_save",
                         env=command_env(TORCH_HOME=str(torch_home)))
    assert code == 0, output
    return root / "job", output, cached


def test_the_weights_and_their_source_are_named_at_the_start(cached_job, tree, tmp_path,
                                                              capsys, monkeypatch):
    """ImageNet weights found in torch.hub's cache (the real command), and a local
    pretrained_path: each job says which weights it took and from where at its start, in its
    out.txt too (random initialisation: below)."""
    import dg_plugins.compat  # noqa: F401  (before torchvision)
    import torchvision

    from dg_plugins.scripts.train import main

    folder, output, cached = cached_job
    expected = f"Weights: torchvision resnet18 from the cache: {cached}"
    assert [line for line in output.splitlines() if line.startswith("Weights: ")] == [expected]
    assert expected in (folder / "out.txt").read_text()

    local = tmp_path / "mine.pth"
    torch.save(torchvision.models.resnet18().state_dict(), local)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))  # the cache is not asked
    assert main(["--dataset", "PACS", "--data_dir", str(tree), "--test_envs", "0", "--steps", "1",
                 "--skip_model_save", "--n_workers", "0", "--output_dir", str(tmp_path / "local"),
                 "--hparams", json.dumps({"batch_size": 2, "resnet18": True,
                                          "pretrained_path": str(local)})]) == 0
    printed = capsys.readouterr().out
    expected = f"Weights: the local file {local} (pretrained_path)"
    assert [line for line in printed.splitlines() if line.startswith("Weights: ")] == [expected]


def test_the_step_time_and_the_estimate_come_after_a_few_steps_then_progress_lines(tmp_path):
    """Not a terminal (a pipe): no progress bar; after the first step and TIMED_STEPS more, one
    line with the measured step time and the estimate (the evaluations included); then, with
    --progress_every 0, a progress line after every step (its default, 60 s, is tested below)."""
    out = tmp_path / "job"
    steps = TIMED_STEPS + 4
    code, output = run(TRAIN, "--dataset", "Debug28", "--test_envs", "0", "--steps", steps,
                       "--checkpoint_freq", "3", "--progress_every", "0", "--hparams",
                       '{"batch_size": 8}', "--output_dir", out, env=command_env(),
                       timeout=TIMEOUT)
    assert code == 0, output
    assert "Weights: random initialisation (no pretrained weights loaded)\n" in output
    timing = [line for line in output.splitlines() if line.startswith("timing: ")]
    assert len(timing) == 1, output
    assert f"mean of steps 1-{TIMED_STEPS}); {steps - TIMED_STEPS - 1} steps left" in timing[0]
    assert "plus 2 evaluations of about" in timing[0] and "for this run" in timing[0]
    progress = [line for line in output.splitlines() if line.startswith("progress: ")]
    assert [line.split(",")[0] for line in progress] == [
        f"progress: step {k}/{steps} ({100 * k / steps:.1f}%)" for k in range(1, steps)]
    assert all("steps/s, about" in line and line.endswith(" left") for line in progress)
    text = (out / "out.txt").read_text()
    assert timing[0] in text and progress[-1] in text and "\r" not in text


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_lines_come_every_interval_and_the_estimate_counts_the_evaluations(capsys):
    """The default interval: steps of 25 s give a line every third step (60 s apart at least);
    the estimate: 5 timed steps of 25 s (the first, warm-up, of 100 s, left out), 14 steps left
    and 2 evaluations of 10 s."""
    clock = FakeClock()
    progress = Progress(20, 0, lambda step: 2, "ERM", interval=DEFAULT_INTERVAL_S, clock=clock)
    progress.evaluated(10.0)
    for step in range(9):
        clock.now += 100.0 if step == 0 else 25.0
        progress.stepped(step, 100.0 if step == 0 else 25.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "progress: step 1/20 (5.0%), 0.01 steps/s, about 31 min 40 s left"
    assert lines[1].startswith("progress: step 4/20 ")
    assert lines[2] == ("timing: 25 s a step (mean of steps 1-5); 14 steps left: about "
                        "5 min 50 s, plus 2 evaluations of about 10 s: about 6 min 10 s left, "
                        "9 min 55 s for this run")
    assert [line.split(",")[0] for line in lines[3:]] == ["progress: step 7/20 (35.0%)"]
    assert [format_duration(s) for s in (0.35, 42, 200, 7500, 198000)] == [
        "0.35 s", "42 s", "3 min 20 s", "2 h 05 min", "2 d 7 h"]


def test_a_terminal_gets_the_progress_bar_and_no_progress_lines(tmp_path):
    """stderr a terminal (a pseudo-terminal here): the tqdm bar is drawn there, and no plain
    progress line is printed, even with --progress_every 0."""
    import os
    import pty
    import select
    import subprocess
    import sys

    master, slave = pty.openpty()
    argv = [sys.executable, "-m", TRAIN, "--dataset", "Debug28", "--test_envs", "0",
            "--steps", "3", "--progress_every", "0", "--hparams", '{"batch_size": 8}',
            "--output_dir", str(tmp_path / "job")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=command_env())
    os.close(slave)
    terminal = b""
    while True:
        ready, _, _ = select.select([master], [], [], TIMEOUT)
        assert ready, "no output on the terminal within the timeout"
        try:
            data = os.read(master, 65536)
        except OSError:  # the job closed the terminal: it exited
            break
        if not data:
            break
        terminal += data
    os.close(master)
    stdout, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, stdout.decode() + terminal.decode()
    assert b"ERM on Debug28" in terminal and b"\r" in terminal
    assert b"progress: " not in stdout + terminal


# The "HParams:" printout lists the hparams the job's network reads ------------------------------

class Reads(dict):
    """hparams that note every name read from them."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        self.read.add(name)
        return super().get(name, default)

    def __contains__(self, name):
        self.read.add(name)
        return super().__contains__(name)


NETWORKS = [  # (algorithm, dataset, input shape, hparams): each backbone and own network
    ("ERM", "Debug224", (3, 224, 224), {"pretrained": False}),  # timm's ResNet-50 (AugMix)
    ("ERM", "Debug224", (3, 224, 224), {"resnet18": True, "pretrained": False}),
    ("ERM", "Debug224", (3, 224, 224), {"resnet50_augmix": False, "pretrained": False}),
    ("ERM", "Debug224", (3, 224, 224), {"vit": True, "vit_arch": "dg_vit_test_patch32_224",
                                        "pretrained": False}),
    ("DMG", "Debug28", (3, 28, 28), {}),  # the MNIST CNN
    ("ERM", "DigitsOffline", (3, 32, 32), {}),  # the dataset's backbone: LeNet
    ("MPBM", "Debug28", (3, 28, 28), {}),
    ("ERM_ViT", "Debug28", (3, 28, 28), {"vit_arch": "tiny", "pretrained": False}),
    ("GMoE", "Debug28", (3, 28, 28), {"vit_arch": "tiny", "gmoe_router_dim": 16,
                                      "pretrained": False}),
    ("DisMAE", "Debug28", (3, 28, 28), {"vit_arch": "tiny", "dismae_decoder_width": 32}),
    ("MAE", "Debug28", (3, 28, 28), {"vit_arch": "tiny", "dismae_decoder_width": 32}),
]


@pytest.mark.parametrize("algorithm, dataset, shape, overrides", NETWORKS,
                         ids=[f"{a}-{d}-{'-'.join(o) or 'default'}" for a, d, _, o in NETWORKS])
def test_the_hparams_listed_are_those_the_network_reads(algorithm, dataset, shape, overrides):
    """The algorithm built with hparams that note what is read: the network hparams listed are
    exactly those its construction reads, but for a false switch that chose another network
    (``resnet18`` false for a ResNet-50, ``vit`` false for a ResNet), which is left out with the
    network hparams of the other backbones; every other hparam is listed."""
    from dg_plugins import hparams as hparams_lib
    from dg_plugins.registry import ALGORITHMS
    from dg_plugins.train.loop import MODEL_HPARAMS, UNREAD_HPARAMS, shown_hparams

    hparams = Reads({**hparams_lib.default_hparams(algorithm, dataset), **overrides})
    listed, left_out = shown_hparams(algorithm, shape, hparams)
    hparams.read.clear()
    ALGORITHMS.get(algorithm)(shape, 4, 1 if algorithm == "MPBM" else 2, hparams)
    read = hparams.read & MODEL_HPARAMS
    switches = {name for name in read - set(listed) if hparams[name] is False}
    assert switches <= {"resnet18", "vit"}, switches
    assert set(listed) & MODEL_HPARAMS == read - switches
    assert set(listed) | set(left_out) == set(hparams) and not set(listed) & set(left_out)
    assert set(left_out) <= MODEL_HPARAMS | UNREAD_HPARAMS


def test_an_algorithm_with_a_network_of_its_own_lists_every_hparam(monkeypatch):
    """A plugin's algorithm that is not ERM-shaped: what its network reads is not known, so
    nothing is left out."""
    from dg_plugins import hparams as hparams_lib
    from dg_plugins.algorithms.base import Algorithm
    from dg_plugins.registry import ALGORITHMS
    from dg_plugins.train.loop import shown_hparams

    monkeypatch.setattr(ALGORITHMS, "get", lambda name: Algorithm)
    hparams = hparams_lib.default_hparams("ERM", "Debug28")
    assert shown_hparams("Mine", (3, 28, 28), hparams) == (sorted(hparams), [])


def test_train_prints_the_hparams_of_its_network_and_records_them_all(cached_job):
    """The real command on a ResNet-18 job (the one with cached weights): out.txt lists
    resnet18 and the ResNet's hparams, not resnet50_augmix nor the ViT's, and names those on
    one line; the records keep every hparam."""
    from dg_plugins import hparams as hparams_lib

    out = cached_job[0]
    text = (out / "out.txt").read_text()
    block = text.split("HParams:\n")[1].split("\n")
    listed = {}
    for line in block:
        if not line.startswith("\t") or line.startswith("\t("):
            break
        name, value = line[1:].split(": ", 1)
        listed[name] = value
    assert listed["resnet18"] == "True" and listed["pretrained"] == "True"
    assert {"batch_size", "lr", "resnet_dropout", "freeze_bn", "augmentation"} <= set(listed)
    left_out = ["dinov2", "lars", "linear_steps", "mnist_cnn_width", "resnet50_augmix", "vit",
                "vit_arch", "vit_attn_tune", "vit_dropout"]
    assert line == f"\t(in the records, not read by this job: {', '.join(left_out)})"
    (record,) = [json.loads(r) for r in (out / "results.jsonl").read_text().splitlines()][-1:]
    assert set(record["hparams"]) == set(listed) | set(left_out)
    assert set(record["hparams"]) == set(hparams_lib.default_hparams("ERM", "PACS"))
