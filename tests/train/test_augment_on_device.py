"""``--augment_on device`` (dg_plugins.datasets.device_augment in the train job): the training
environments' items are their transform's crop (uint8, made by the loader) finished by the device
augmentation seeded by the batch's seed (a stream's batch k: ``seed_hash(stream seed, k)``; a
pooled batch at once), their augmented out-splits evaluated so too, seeded per (split, batch),
with the cache's evaluation pixels kept apart from the loader path's; the test environments and
an official split's validation items stay exact. A real job (a subprocess) records the setting,
learns, resumes exactly, is reproduced by a re-evaluation of its model and differs from the
loader path; resuming with the other value, datasets without an augmentation and a missing kornia
are refused in one line; sweep hashes the setting and collect_results notes it."""

import argparse
import json
import os
import shlex
import shutil
import signal
import sys

import pytest
import torch

import dg_plugins.compat  # noqa: F401  (before torchvision)
from dg_plugins.datasets import decoded
from dg_plugins.datasets.decoded import TableFinisher
from dg_plugins.datasets.device_augment import DeviceFinisher, use_device_augmentation
from dg_plugins.datasets.image_folder import PACS
from dg_plugins.seeds import seed_hash
from dg_plugins.train import batches, evaluate
from dg_plugins.train.splits import SplitDataset, finisher, split_dataset
from support.devices import job_device
from support.helpers import VOLATILE_KEYS, read_records
from support.image_tree import make_pacs_tree, write_pacs_split_lists
from support.job_gate import gate_env, released, wait_at_gate
from support.processes import command_env, finish, run, start, survivors

TRAIN = "dg_plugins.scripts.train"
TIMEOUT = 240
AUGMENT = {"data_augmentation": True}
#: A tiny random-init ViT at 224x224 (augmentation on: every image dataset's default).
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32, "lr": 3e-4})
STEPS, FREQ = 12, 4  # records at steps 0, 4, 8, 11



def pacs(root, device: bool, cache_on: bool = True, hparams=AUGMENT):
    dataset = PACS(str(root), [0], hparams)
    if device:
        use_device_augmentation(dataset, "PACS")
    if cache_on:
        decoded.prepare(dataset)
    return dataset


# ------------------------------------------------------------------------------------------------
# Training batches and evaluation batches


@pytest.mark.parametrize("workers", [0, 2])
def test_training_batches_are_crops_augmented_on_the_device_with_their_batch_seed(
        tmp_path, cache, workers):
    """Stream batch k: the crops fetched under ``seed_hash(seed, k)``, augmented with that seed
    (with or without loader workers); a pooled batch augmented at once with its one seed, then
    cut per domain. Not the exact table's floats of the same crops."""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    dataset = pacs(root, device=True)
    env = dataset.datasets[1]
    device_finisher = finisher(env)
    assert isinstance(device_finisher, DeviceFinisher)
    assert isinstance(finisher(dataset.datasets[0]), TableFinisher)  # the test environment

    stream = batches.BatchStream(env, 4, seed=5)
    pooled = batches.PooledBatches([dataset.datasets[1], dataset.datasets[2]], 5, seed=7)
    got = []
    for group in ([stream], [pooled]):
        batches.share_workers(group, workers)
        try:
            got.append([next(s) for s in group for _ in range(3)])
        finally:
            for s in group:
                s.close()

    reference = batches.BatchStream(env, 4, seed=5)
    for k, (x, y) in enumerate(got[0]):
        seed, indices = reference.draw()
        assert seed == seed_hash(5, k)
        pixels, labels = batches.fetch(env, indices, seed, pixels=True)
        assert pixels.dtype == torch.uint8 and pixels.shape == (4, 3, 224, 224)
        assert torch.equal(x, device_finisher(pixels, "cpu", seed)) and torch.equal(y, labels)
        assert not torch.allclose(x, decoded.to_model_input(pixels, env.pixel_transform(
            dataset.plain_transform).table, "cpu"))
    reference = batches.PooledBatches([dataset.datasets[1], dataset.datasets[2]], 5, seed=7)
    for k, minibatches in enumerate(got[1]):
        seed, indices = reference.draw()
        pixels, labels, part = batches.fetch(reference.dataset, indices, seed, pixels=True)
        x = device_finisher(pixels, "cpu", seed_hash(7, k))
        for i, (u, v) in enumerate(minibatches):
            assert torch.equal(u, x[part == i]) and torch.equal(v, labels[part == i])


@pytest.mark.parametrize("workers", [0, 2])
def test_augmented_splits_are_evaluated_on_the_device_seeded_per_split_and_batch(
        tmp_path, cache, monkeypatch, workers):
    """A training environment's out-split: batch k is the crops made under ``seed_hash(seed,
    k)``, augmented with that seed, at the first evaluation (which keeps the crops in the cache)
    and at later ones (which read them in chunks of two batches); the test environment's split is
    the loader path's exactly. The cache keeps the two paths' pixels in separate files."""
    monkeypatch.setattr(evaluate, "CHUNK_IMAGES", 7)  # chunks of 2 batches of 3
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)

    def splits(device):
        dataset = pacs(root, device)
        plain, _ = split_dataset(dataset.datasets[0], 5, seed=1)
        augmented, _ = split_dataset(dataset.datasets[2], 8, seed=2)
        return [(plain, 11), (augmented, 12)]

    def batches_of(datasets):
        return [(j, x, y) for j, x, y in evaluate.eval_batches_of(datasets, 3, workers)]

    datasets = splits(device=True)
    augmented = datasets[1][0]
    want = []
    for k, first in enumerate(range(0, 8, 3)):
        seed = seed_hash(12, k)
        pixels, labels = batches.fetch(augmented, list(range(first, min(first + 3, 8))), seed,
                                       pixels=True)
        want.append((finisher(augmented)(pixels, "cpu", seed), labels))
    first = batches_of(datasets)
    kept = sorted(p.name for p in next(cache.iterdir()).glob("*.eval-*.npy"))
    assert len(kept) == 1
    for got in (first, batches_of(datasets), batches_of(splits(device=True))):
        assert [(x.shape[0], j) for j, x, _ in got] == [(3, 0), (2, 0), (3, 1), (3, 1), (2, 1)]
        for (_, x, y), (u, v) in zip([b for b in got if b[0] == 1], want):
            assert torch.equal(x, u) and torch.equal(y, v)
    loader = batches_of(splits(device=False))
    assert len(list(next(cache.iterdir()).glob("*.eval-*.npy"))) == 2  # one per path
    for (j, x, _), (_, u, _) in zip(loader, first):
        assert torch.equal(x, u) == (j == 0)  # the plain split alike, the augmented one not


def test_an_official_splits_validation_items_stay_exact(tmp_path, cache):
    """PACS's official split: a training environment's validation (out) items keep the plain
    transform, exactly (the loader path's floats); its in-split is augmented on the device; a
    split holding both kinds of item is refused, not made on the loader."""
    root = make_pacs_tree(tmp_path / "tree", per_class=3, size=40)
    write_pacs_split_lists(root)
    hparams = {**AUGMENT, "data_split": "official"}
    dataset = pacs(root, device=True, hparams=hparams)
    in_, out = (SplitDataset(dataset.datasets[1], keys) for keys in dataset.predefined_split(1))
    assert isinstance(finisher(in_), DeviceFinisher)
    assert isinstance(finisher(out), TableFinisher)
    with pytest.raises(ValueError, match="--augment_on device: a split of .* use --augment_on"):
        finisher(dataset.datasets[1])
    loader = pacs(root, device=False, hparams=hparams)
    loader_out = SplitDataset(loader.datasets[1], loader.predefined_split(1)[1])
    for (x, y), (u, v) in zip(evaluate.eval_batches(out, 4, 0, seed=3),
                              evaluate.eval_batches(loader_out, 4, 0, seed=3)):
        assert torch.equal(x, u) and torch.equal(y, v)


# ------------------------------------------------------------------------------------------------
# Refusals


def test_datasets_without_an_augmentation_are_refused_in_one_line(tmp_path, capsys):
    from dg_plugins.scripts.train import main

    tree = make_pacs_tree(tmp_path / "tree", per_class=1, size=32)
    cases = [
        (["--dataset", "Debug28"], "Debug28 has no augmentation to run on the device (its "
         "images are held in memory as tensors"),
        (["--dataset", "PACS", "--data_dir", str(tree), "--hparams",
          '{"data_augmentation": false}'], "PACS is not augmented (data_augmentation is false)"),
    ]
    for k, (flags, reason) in enumerate(cases):
        out = tmp_path / f"job{k}"
        assert main([*flags, "--augment_on", "device", "--device", "cpu", "--output_dir",
                     str(out)]) == 2
        err = [line for line in (out / "err.txt").read_text().splitlines() if line.strip()]
        assert len(err) == 1 and reason in err[0] and "use --augment_on loader" in err[0], err
        assert err[0] in capsys.readouterr().out and not read_records(out)


def test_a_missing_kornia_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    from dg_plugins.scripts.train import main

    monkeypatch.setitem(sys.modules, "kornia", None)  # import kornia raises ImportError
    out = tmp_path / "job"
    assert main(["--dataset", "Debug28", "--augment_on", "device", "--device", "cpu",
                 "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--augment_on device needs kornia" in err[0], err
    assert "pip install 'dg_plugins[gpu]'" in err[0]
    assert not out.exists()


# ------------------------------------------------------------------------------------------------
# The job, as users run it


def train_args(tree, out, *extra, steps=STEPS):
    return ["--dataset", "PACS", "--data_dir", tree, "--algorithm", "ERM", "--test_envs", "0",
            "--steps", steps, "--checkpoint_freq", FREQ, "--hparams", HPARAMS,
            "--output_dir", out, *extra]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_pacs_tree(tmp_path_factory.mktemp("pacs_tree"), per_class=2, size=40)


@pytest.fixture(scope="module")
def reference(tree, tmp_path_factory):
    """An uninterrupted ``--augment_on device`` run without loader workers (its folder)."""
    out = tmp_path_factory.mktemp("reference") / "job"
    code, output = run(TRAIN, *train_args(tree, out, "--augment_on", "device", "--n_workers",
                                          "0"), env=command_env(), timeout=TIMEOUT)
    assert code == 0, output[-3000:]
    return out


def test_a_device_augmented_job_records_its_setting_and_learns(reference):
    records = read_records(reference)
    assert [r["step"] for r in records] == [0, 4, 8, 11]
    assert all(r["args"]["augment_on"] == "device" for r in records)
    assert records[0]["hparams"]["data_augmentation"]
    assert records[-1]["loss"] < records[0]["loss"]
    assert "augment_on: device" in (reference / "out.txt").read_text()


def test_it_resumes_exactly_and_only_with_its_setting(tree, reference, tmp_path, capsys):
    """Stopped by SIGTERM after step 5 (with 2 loader workers where the reference had none),
    refused on ``--resume`` without the flag (in this process), then resumed: the reference's
    records."""
    from dg_plugins.scripts.train import main

    out, gate = tmp_path / "cut", tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=5)
    proc = start(TRAIN, *train_args(tree, out, "--augment_on", "device", "--n_workers", "2"),
                 env=env)
    with released(gate):
        wait_at_gate(gate, proc, TIMEOUT)
        os.killpg(proc.pid, signal.SIGTERM)
        code, output = finish(proc, TIMEOUT)
    assert code in (128 + signal.SIGTERM, -signal.SIGTERM), output[-3000:]
    assert not survivors(env)
    assert len(read_records(out)) == 2
    capsys.readouterr()
    assert main([str(a) for a in train_args(tree, out, "--resume")]) == 2
    output = "".join(capsys.readouterr())  # the job's output (stdout) and stderr
    assert "--augment_on: 'device' in the checkpoint, 'loader' now (the default)" in output
    code, output = run(TRAIN, *train_args(tree, out, "--augment_on", "device", "--resume",
                                          "--n_workers", "2"), env=command_env(),
                       timeout=TIMEOUT)
    assert code == 0 and "Resuming from step 6" in output, output[-3000:]
    assert read_records(out, drop=VOLATILE_KEYS) == read_records(reference, drop=VOLATILE_KEYS)


def test_the_loader_path_gives_other_records(tree, reference, tmp_path):
    """The same job's first step with the default ``--augment_on loader`` (in this process,
    without loader workers, as the reference): another loss."""
    from dg_plugins.scripts.train import main

    out = tmp_path / "loader"
    assert main([str(a) for a in train_args(tree, out, "--augment_on", "loader",
                                            "--n_workers", "0", steps=1)]) == 0
    (record,) = read_records(out)
    assert "augment_on" not in record["args"]  # the default: the job as before
    assert record["loss"] != read_records(reference)[0]["loss"]


def test_re_evaluating_the_saved_model_reproduces_its_record(reference):
    """As alignment_eval rebuilds a job (from its record's args): the device augmentation of the
    training environments' splits, seeded per (split, batch), gives the record's accuracies
    exactly (the augmented splits' crops now read from the cache the job filled)."""
    from dg_plugins.registry import ALGORITHMS
    from dg_plugins.train.loop import build_job_data
    from dg_plugins.train.compute import Compute

    record = read_records(reference)[-1]
    saved = torch.load(reference / "model.pkl", weights_only=False)
    args = argparse.Namespace(**saved["args"])
    data = build_job_data(args, saved["model_hparams"], n_workers=0)
    assert isinstance(finisher(data.splits.out_splits[1][0]), DeviceFinisher)
    algorithm = ALGORITHMS.get("ERM")(saved["model_input_shape"], saved["model_num_classes"],
                                      saved["model_num_domains"], saved["model_hparams"])
    algorithm.load_state_dict(saved["model_dict"])
    device = job_device()
    with Compute.of(args).active(device):
        again = evaluate.evaluate(algorithm.to(device), data.splits, device)
    assert again == {k: record[k] for k in again}


# ------------------------------------------------------------------------------------------------
# Sweep and collect_results


def test_sweep_passes_it_to_every_job_and_hashes_it_only_when_not_default(tmp_path):
    from dg_plugins.scripts.train import build_parser
    from dg_plugins.sweep import cli as sweep_cli

    def sweep_jobs(*flags):
        return sweep_cli.sweep_jobs(["launch", "--datasets", "PACS", "--algorithms", "ERM",
                                     "--n_trials", "1", "--n_hparams", "1", "--data_dir", "d",
                                     "--output_dir", str(tmp_path), *flags], dry_run=True)[1]

    default = sweep_jobs()
    assert [j.command_str for j in sweep_jobs("--augment_on", "loader")] == [
        j.command_str for j in default]
    assert "--augment_on" not in default[0].command_str
    device = sweep_jobs("--augment_on", "device")
    assert len(device) == len(default)
    assert {j.output_dir for j in device}.isdisjoint(j.output_dir for j in default)
    command = shlex.split(device[0].command_str)
    assert build_parser().parse_args(command[3:]).augment_on == "device"


def test_collect_results_notes_runs_augmented_on_the_device(shared_fixtures, tmp_path, capsys):
    from dg_plugins.scripts import collect_results

    sweep = tmp_path / "sweep"
    shutil.copytree(shared_fixtures / "domainbed_sweep_data", sweep)
    assert collect_results.main(["--input_dir", str(sweep)]) == 0
    plain_out, _ = capsys.readouterr()
    folders = sorted(p for p in sweep.iterdir() if (p / "results.jsonl").exists())
    for folder in folders[:2]:
        path = folder / "results.jsonl"
        path.write_text("".join(json.dumps({**r, "args": {**r["args"], "augment_on": "device"}})
                                + "\n" for r in map(json.loads, path.read_text().splitlines())))
    assert collect_results.main(["--input_dir", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert out == plain_out
    assert (f"Compute settings: of the {len(folders)} runs (job folders) read, 2 used "
            f"--augment_on device; {len(folders) - 2} the defaults") in " ".join(err.split())

