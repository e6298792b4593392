"""The GPU lane of ``--augment_on device``: the device augmentation on CUDA, from pinned crops
under torch's deterministic algorithms, gives the CPU's numbers up to float32 rounding; a ResNet
job augmenting on CUDA (a subprocess, default loader workers) writes the same records twice and
after a SIGTERM and ``--resume``, with no nondeterministic kernel."""

import json
import os
import signal

import torch

from support.devices import needs_cuda
from support.helpers import VOLATILE_KEYS, read_records
from support.image_tree import make_pacs_tree
from support.job_gate import gate_env, released, wait_at_gate
from support.processes import command_env, finish, run, start, survivors

pytestmark = needs_cuda

TRAIN = "dg_plugins.scripts.train"
TIMEOUT = 300
HPARAMS = json.dumps({"resnet18": True, "pretrained": False, "batch_size": 8})
NONDETERMINISTIC = ("non-deterministic", "nondeterministic", "does not have a deterministic")


def test_the_finisher_on_cuda_gives_the_cpus_numbers_deterministically(tmp_path):
    from dg_plugins.datasets.device_augment import use_device_augmentation
    from dg_plugins.datasets.image_folder import PACS
    from dg_plugins.seeds import deterministic_algorithms
    from dg_plugins.train.batches import fetch
    from dg_plugins.train.splits import finisher

    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=64)
    dataset = PACS(str(root), [0], {"data_augmentation": True})
    use_device_augmentation(dataset, "PACS")
    env = dataset.datasets[1]
    pixels, _ = fetch(env, list(range(8)), 3, pixels=True)
    device_finisher = finisher(env)
    with deterministic_algorithms():
        on_cuda = device_finisher(pixels.pin_memory(), torch.device("cuda"), 11)
        again = device_finisher(pixels.pin_memory(), torch.device("cuda"), 11)
    assert on_cuda.device.type == "cuda" and torch.equal(on_cuda, again)
    torch.testing.assert_close(on_cuda.cpu(), device_finisher(pixels, "cpu", 11), rtol=0,
                               atol=1e-3)


def test_a_job_augmenting_on_cuda_repeats_and_resumes_exactly(tmp_path):
    tree = make_pacs_tree(tmp_path / "tree", per_class=2, size=64)

    def args(out, *extra):
        return ["--dataset", "PACS", "--data_dir", tree, "--algorithm", "ERM", "--test_envs",
                "0", "--steps", "7", "--checkpoint_freq", "2", "--hparams", HPARAMS,
                "--augment_on", "device", "--output_dir", out, *extra]

    runs = []
    for k in range(2):
        out = tmp_path / f"job{k}"
        env = command_env()
        code, output = run(TRAIN, *args(out), env=env, timeout=TIMEOUT)
        assert code == 0, output[-3000:]
        assert not survivors(env)
        assert "Device: cuda" in (out / "out.txt").read_text()
        warned = [line for line in (out / "err.txt").read_text().splitlines()
                  if any(word in line for word in NONDETERMINISTIC)]
        assert not warned, warned
        assert all(r["args"]["augment_on"] == "device" for r in read_records(out))
        runs.append(read_records(out, drop=VOLATILE_KEYS))
    assert runs[0] == runs[1] and [r["step"] for r in runs[0]] == [0, 2, 4, 6]

    out, gate = tmp_path / "cut", tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=3)
    proc = start(TRAIN, *args(out), env=env)
    with released(gate):
        wait_at_gate(gate, proc, TIMEOUT)
        os.killpg(proc.pid, signal.SIGTERM)
        code, output = finish(proc, TIMEOUT)
    assert code in (128 + signal.SIGTERM, -signal.SIGTERM), output[-3000:]
    code, output = run(TRAIN, *args(out, "--resume"), env=command_env(), timeout=TIMEOUT)
    assert code == 0 and "Resuming from step 4" in output, output[-3000:]
    assert read_records(out, drop=VOLATILE_KEYS) == runs[0]
