"""Exact resume with augmentation (issue 31, item 1): an image-folder job with the default
augmentation and the default loader workers, run as a user runs it (a subprocess), interrupted
by SIGTERM or killed with SIGKILL, then ``--resume``d, writes the records of an uninterrupted run;
and a run without loader workers (``--n_workers 0``) writes them too. Before batches were seeded
per (stream, batch index), the workers' augmentation RNGs restarted from other seeds after a
resume and every resumed record differed. And evaluating a saved model again reproduces the
accuracies of its record, augmented splits included."""

import json
import os
import signal

import pytest

from support.devices import job_device
from support.helpers import VOLATILE_KEYS, read_records
from support.image_tree import make_pacs_tree
from support.job_gate import gate_env, released, wait_at_gate
from support.processes import command_env, finish, run, start, survivors

TRAIN = "dg_plugins.scripts.train"
TIMEOUT = 120
#: The cores the interrupted run is given (``DG_PLUGINS_CPUS``, as a launcher gives them): a GPU
#: node's 16, whatever this machine has, so its default workers are 16 on any machine.
CORES = "16"
#: A tiny random-init ViT at 224x224; augmentation is on (the default of every image dataset).
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32})
STEPS, FREQ = 7, 2  # records at steps 0, 2, 4, 6


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_pacs_tree(tmp_path_factory.mktemp("pacs_tree"), per_class=2, size=40)


def train_args(tree, out, *extra, steps=STEPS):
    return ["--dataset", "PACS", "--data_dir", tree, "--algorithm", "ERM", "--test_envs",
            "0", "--steps", steps, "--checkpoint_freq", FREQ, "--hparams", HPARAMS,
            "--output_dir", out, *extra]


def interrupt(args, out, step, signum, tmp_path):
    """Run train, held by the test's gate after ``step``, and send ``signum`` to its process
    group there."""
    gate = tmp_path / f"gate{step}"
    gate.mkdir()
    env = gate_env(gate, step=step, DG_PLUGINS_CPUS=CORES)
    proc = start(TRAIN, *args, env=env)
    with released(gate):
        wait_at_gate(gate, proc, TIMEOUT)
        os.killpg(proc.pid, signum)
        code, output = finish(proc, TIMEOUT)
    assert code in (128 + signum, -signum), output
    assert not (out / "done").exists()
    assert not survivors(env)


@pytest.fixture(scope="module")
def reference(tree, tmp_path_factory):
    """An uninterrupted run without loader workers (its folder)."""
    out = tmp_path_factory.mktemp("reference") / "job"
    code, output = run(TRAIN, *train_args(tree, out, "--n_workers", "0"), env=command_env(),
                       timeout=TIMEOUT)
    assert code == 0, output
    assert "loader workers: 0" in (out / "out.txt").read_text()
    return out


def test_resumed_augmented_job_writes_the_records_of_an_uninterrupted_run(tree, reference,
                                                                          tmp_path):
    """Reference: an uninterrupted run without loader workers. The other run has the default
    workers (one per core, 16 with :data:`CORES`), is stopped by SIGTERM after step 3 (past its 2nd record), resumed, killed
    with SIGKILL after step 5 (past its 3rd record; the resume then continues from the last
    checkpoint), resumed again; the test's gate holds the job at each of these steps."""
    expected = read_records(reference, drop=VOLATILE_KEYS)
    assert [r["step"] for r in expected] == [0, 2, 4, 6]
    assert expected[0]["hparams"]["data_augmentation"]
    env = command_env(DG_PLUGINS_CPUS=CORES)
    out = tmp_path / "interrupted"
    interrupt(train_args(tree, out), out, 3, signal.SIGTERM, tmp_path)
    assert len(read_records(out)) == 2
    interrupt(train_args(tree, out, "--resume"), out, 5, signal.SIGKILL, tmp_path)
    assert len(read_records(out)) == 3
    code, output = run(TRAIN, *train_args(tree, out, "--resume"), env=env, timeout=TIMEOUT)
    assert code == 0 and "Resuming from step" in output, output
    assert not survivors(env)
    text = (out / "out.txt").read_text()
    assert text.count("Resuming from step") == 2
    assert "loader workers: 16 (one per core: 16 cores, $DG_PLUGINS_CPUS)" in text
    assert read_records(out, drop=VOLATILE_KEYS) == expected


def test_re_evaluating_a_saved_model_reproduces_its_record(tree, reference):
    """The evaluation of an augmented split (DomainBed augments the training environments'
    out-splits) is seeded per (split, batch): evaluating the saved model again, here with 2
    loader workers where the job had none, gives the accuracies of its last record exactly (what
    ``alignment_eval --update_records`` relies on)."""
    import argparse

    import torch

    import dg_plugins.algorithms  # noqa: F401
    import dg_plugins.datasets  # noqa: F401
    from dg_plugins.train.evaluate import evaluate
    from dg_plugins.train.splits import Splits
    from dg_plugins.registry import ALGORITHMS, DATASETS

    record = read_records(reference)[-1]
    saved = torch.load(reference / "model.pkl", weights_only=False)
    hparams = saved["model_hparams"]
    dataset = DATASETS.get("PACS")(str(tree), [0], hparams)
    assert dataset.augmented_envs == [1, 2, 3]
    algorithm = ALGORITHMS.get("ERM")(saved["model_input_shape"], saved["model_num_classes"],
                                      saved["model_num_domains"], hparams)
    algorithm.load_state_dict(saved["model_dict"])
    splits = Splits(dataset, argparse.Namespace(**saved["args"]), hparams)
    device = job_device()  # the job's own (CUDA where visible): the same kernels
    again = evaluate(algorithm.to(device), splits, device, num_workers=2)
    assert again == {k: record[k] for k in again}
