"""The GPU lane: what users run on a GPU node, run on CUDA when a device is visible (skipped,
saying so, on a machine without one). Train, evaluation, checkpoints and resume of a ResNet job
and of a ViT job with its MoE layers (GMoE), each as a user runs it (a subprocess, default flags,
default loader workers): under ``--deterministic true`` (the default) two runs, and a run stopped
by SIGTERM then killed by SIGKILL and resumed each time, write identical records, and torch never
warns of a nondeterministic kernel. Also ``--precision bf16|fp16`` under CUDA autocast in
training and evaluation, the ``multi_gpu`` launcher on the GPUs it sees, and the benchmarks' GPU
paths."""

import json
import os
import signal

import pytest
import torch

from support.devices import needs_cuda
from support.helpers import VOLATILE_KEYS, read_records
from support.image_tree import make_pacs_tree
from support.job_gate import gate_env, released, wait_at_gate
from support.processes import REPO, command_env, finish, python_path, run, start, survivors

pytestmark = needs_cuda

TRAIN = "dg_plugins.scripts.train"
TIMEOUT = 300
STEPS, FREQ = "7", "2"  # records at steps 0, 2, 4, 6
JOBS = {
    "resnet": ("ERM", {"resnet18": True, "pretrained": False, "batch_size": 8}),
    "gmoe": ("GMoE", {"vit_arch": "tiny", "gmoe_router_dim": 16, "pretrained": False,
                      "batch_size": 8}),
}
#: What torch says when a kernel of a deterministic job has no deterministic implementation.
NONDETERMINISTIC = ("non-deterministic", "nondeterministic", "does not have a deterministic")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_pacs_tree(tmp_path_factory.mktemp("pacs_tree"), per_class=2, size=64)


def train_args(tree, out, kind, *extra):
    algorithm, hparams = JOBS[kind]
    return ["--dataset", "PACS", "--data_dir", tree, "--algorithm", algorithm, "--test_envs",
            "0", "--steps", STEPS, "--checkpoint_freq", FREQ, "--hparams", json.dumps(hparams),
            "--output_dir", out, *extra]


def uninterrupted(tree, out, kind):
    env = command_env()
    code, output = run(TRAIN, *train_args(tree, out, kind), env=env, timeout=TIMEOUT)
    assert code == 0, output
    assert not survivors(env)
    text = (out / "out.txt").read_text()
    assert "Device: cuda" in text, text[:2000]
    warned = [line for line in (out / "err.txt").read_text().splitlines()
              if any(word in line for word in NONDETERMINISTIC)]
    assert not warned, warned
    return read_records(out, drop=VOLATILE_KEYS)


def interrupt(args, out, step, signum, gate):
    gate.mkdir()
    env = gate_env(gate, step=step)
    proc = start(TRAIN, *args, env=env)
    with released(gate):
        wait_at_gate(gate, proc, TIMEOUT)
        os.killpg(proc.pid, signum)
        code, output = finish(proc, TIMEOUT)
    assert code in (128 + signum, -signum), output
    assert not survivors(env)


@pytest.mark.parametrize("kind", list(JOBS))
def test_two_runs_and_an_interrupted_resumed_run_write_identical_records(tree, tmp_path, kind):
    first = uninterrupted(tree, tmp_path / "first", kind)
    assert [r["step"] for r in first] == [0, 2, 4, 6]
    assert all(r["mem_gb"] > 0 for r in read_records(tmp_path / "first"))  # CUDA memory
    assert uninterrupted(tree, tmp_path / "second", kind) == first
    out = tmp_path / "interrupted"
    interrupt(train_args(tree, out, kind), out, 3, signal.SIGTERM, tmp_path / "gate3")
    interrupt(train_args(tree, out, kind, "--resume"), out, 5, signal.SIGKILL,
              tmp_path / "gate5")
    env = command_env()
    code, output = run(TRAIN, *train_args(tree, out, kind, "--resume"), env=env,
                       timeout=TIMEOUT)
    assert code == 0 and "Resuming from step" in output, output
    assert read_records(out, drop=VOLATILE_KEYS) == first


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_runs_training_and_evaluation_under_cuda_autocast(
        tmp_path, monkeypatch, precision):
    from dg_plugins.registry import ALGORITHMS
    from dg_plugins.train import run as train
    from dg_plugins.train.cli import build_parser
    from dg_plugins.train.compute import Compute

    erm = ALGORITHMS.get("ERM")
    calls = {"update": [], "predict": []}

    def state(x):
        return (x.device.type, torch.is_autocast_enabled("cuda")
                and torch.get_autocast_dtype("cuda"))

    def update(self, minibatches, unlabeled=None):
        calls["update"].append(state(minibatches[0][0]))
        return real_update(self, minibatches, unlabeled)

    def predict(self, x):
        calls["predict"].append(state(x))
        return real_predict(self, x)

    real_update, real_predict = erm.update, erm.predict
    monkeypatch.setattr(erm, "update", update)
    monkeypatch.setattr(erm, "predict", predict)
    args = build_parser().parse_args(["--dataset", "Debug28", "--hparams", '{"batch_size": 8}',
                                      "--steps", "3", "--precision", precision, "--device",
                                      "cuda", "--output_dir", str(tmp_path)])
    try:
        assert train.run(args) == "done"
    finally:
        Compute().configure_backends()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert calls["update"] == [("cuda", dtype)] * 3
    assert calls["predict"] and set(calls["predict"]) == {("cuda", dtype)}
    assert all(r["args"]["precision"] == precision for r in read_records(tmp_path))


def test_multi_gpu_launcher_runs_a_job_on_each_visible_gpu(tmp_path):
    import re

    gpus = [str(i) for i in range(torch.cuda.device_count())]
    env = command_env(CUDA_VISIBLE_DEVICES=",".join(gpus))
    out = tmp_path / "sweep"
    code, output = run("dg_plugins.scripts.sweep", "launch", "--datasets", "Debug28",
                       "--algorithms", "ERM", "--test_env_sets", "0", "--n_hparams", "1",
                       "--n_trials", str(2 * len(gpus)), "--steps", "3", "--checkpoint_freq",
                       "2", "--hparams", '{"batch_size": 8}', "--data_dir", "builtin",
                       "--output_dir", out, "--command_launcher", "multi_gpu",
                       "--skip_confirmation", env=env, timeout=TIMEOUT)
    assert code == 0, output
    jobs = [p.parent for p in out.glob("*/done")]
    assert len(jobs) == 2 * len(gpus)
    assert set(re.findall(r" started on GPU (\d+):", output)) == set(gpus), output
    for job in jobs:
        assert "Device: cuda:0" in (job / "out.txt").read_text()  # its one visible GPU


def test_gpu_benchmark_runs_its_gpu_version_and_names_the_device(tmp_path):
    report = tmp_path / "gpu.md"
    code, output = run("benchmarks", "gpu", "--algorithms", "ERM ResNet-18",
                       "GMoE-S/16", "--batch_size", "4", "--steps", "1", "--warmup", "1",
                       "--workers", "2", "--loader_rounds", "2", "--per_class", "1",
                       "--eval_repeats", "1", "--out", report,
                       env=command_env(PYTHONPATH=python_path(REPO, REPO / "tests")),
                       timeout=TIMEOUT)
    assert code == 0, output
    text = report.read_text()
    assert text.startswith("# GPU benchmarks\n") and "REDUCED" not in text
    assert f"Device: {torch.cuda.get_device_name(0)}" in text
