"""``--eval_splits`` and the evaluation's throughput: which splits a job evaluates
(:func:`dg_plugins.job.selection.evaluated_splits`, derived from the declaration of what model
selection reads, :data:`SELECTION_READS`), what its records say, a resume with the other value,
``--eval_batch_size``, the one worker pool of training and evaluation, inference mode and the
CUDA-only pinned memory."""

import json

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dg_plugins.train import batches
from dg_plugins.train import cli as train_cli
from dg_plugins.train import run as train_run
from dg_plugins.train.evaluate import accuracies
from dg_plugins.job.selection import SELECTION_READS, evaluated_splits, record_kinds

from support.helpers import read_records
from support.image_tree import make_pacs_tree
from support.processes import command_env, run


def test_all_is_every_split_in_domainbeds_order():
    assert evaluated_splits("all", [1], 3, uda=1) == [
        "env0_in", "env1_in", "env2_in", "env0_out", "env1_out", "env2_out", "env0_uda"]


@pytest.mark.parametrize("test_envs, n_envs, udg, expected_in", [
    ([0], 4, False, [0]),           # DomainBed's single test environment
    ([0, 2], 4, False, [0, 2]),     # a leave-one-domain-out pair run
    ([1, 2], 3, False, [1, 2]),     # a pair run that is also single-source (source 0)
    ([1, 2, 3, 4, 5], 6, False, [1, 2, 3, 4, 5]),  # single-source
    ([0, 5], 6, True, [0, 5]),      # UDG
])
def test_selection_skips_only_the_training_in_splits(test_envs, n_envs, udg, expected_in):
    names = evaluated_splits("selection", test_envs, n_envs, uda=len(test_envs), udg=udg)
    assert names == ([f"env{i}_in" for i in expected_in]
                     + [f"env{i}_out" for i in range(n_envs)]
                     + [f"env{k}_uda" for k in range(len(test_envs))])


def test_selection_is_the_union_of_the_declared_reads(monkeypatch):
    """Derived from the declaration, not a second copy: a method that read the training
    environments' in-splits would make selection evaluate them."""
    reads = {kind: {key: dict(value) for key, value in methods.items()}
             for kind, methods in SELECTION_READS.items()}
    reads["domainbed"]["oracle"]["in"] = "train"
    monkeypatch.setitem(SELECTION_READS, "domainbed", reads["domainbed"])
    assert evaluated_splits("selection", [0], 3) == [
        "env0_in", "env1_in", "env2_in", "env0_out", "env1_out", "env2_out"]


def test_record_kinds():
    assert record_kinds([0], 4) == ("domainbed",)
    assert record_kinds([1, 2, 3], 4) == ("domainbed", "single_source")
    assert record_kinds([1, 2, 3], 4, udg=True) == ("udg",)


def test_unknown_value_is_refused():
    with pytest.raises(ValueError, match="--eval_splits must be one of all, selection"):
        evaluated_splits("some", [0], 3)


# --------------------------------------------------------------------------------------------------
# The job: records, resume, the worker pool, the evaluation's forward

TRAIN = "dg_plugins.scripts.train"
#: A tiny random-init ViT at 224x224: the PACS tree's real transforms, decoded in loader workers.
IMAGE_HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                            "pretrained": False, "batch_size": 4, "image_size": 32})
#: Record keys measured on the wall clock, and what only a selection record holds.
VOLATILE = ("step_time", "mem_gb", "args", "evaluated_splits")


def test_selection_evaluates_fewer_splits_with_the_same_values_and_one_worker_pool(tmp_path):
    """The same image job (PACS tree, ERM, test environment 0, default loader workers, three
    records) run with ``--eval_splits all`` and ``selection``: the selection records hold every
    key selection reads (every out-split, the test environment's in-split) with the values of
    the ``all`` run, lack the training environments' in-splits, say which splits they evaluated
    and carry ``eval_splits`` in their args; training is untouched (same losses). In both runs
    one pool of loader workers, started once, makes the batches of training and of every
    evaluation (each worker start is counted by the ``worker_starts`` plugin)."""
    tree = make_pacs_tree(tmp_path / "tree")
    records = {}
    for mode in ("all", "selection"):
        out, starts = tmp_path / mode, tmp_path / f"{mode}.starts"
        env = command_env(DG_PLUGINS_IMPORT="support.worker_starts", DG_TEST_WORKER_STARTS=str(starts))
        code, output = run(TRAIN, "--dataset", "PACS", "--data_dir", tree, "--algorithm", "ERM",
                           "--test_envs", "0", "--steps", "5", "--checkpoint_freq", "2",
                           "--hparams", IMAGE_HPARAMS, "--output_dir", out,
                           "--eval_splits", mode, env=env, timeout=300)
        assert code == 0, output
        records[mode] = read_records(out)
        text = (out / "out.txt").read_text()
        workers = int(text.split("loader workers: ")[1].split()[0])
        pids = starts.read_text().split()
        assert workers >= 1 and len(pids) == workers, (
            f"{mode}: {len(pids)} worker starts for a job of {workers} workers and 3 records")
    full, chosen = records["all"], records["selection"]
    assert [r["step"] for r in chosen] == [r["step"] for r in full] == [0, 2, 4]
    expected = ["env0_in", "env0_out", "env1_out", "env2_out", "env3_out"]
    for all_record, record in zip(full, chosen):
        assert record["evaluated_splits"] == expected and "evaluated_splits" not in all_record
        assert record["args"]["eval_splits"] == "selection"
        assert "eval_splits" not in all_record["args"]
        assert sorted(k for k in record if k.endswith("_acc")) == sorted(
            name + "_acc" for name in expected)
        assert {k for k in all_record if k.endswith("_in_acc")} == {
            f"env{i}_in_acc" for i in range(4)}
        for key, value in record.items():
            if key not in VOLATILE:
                assert value == all_record[key], key


def test_a_resume_with_the_other_value_is_refused(tmp_path):
    """A job interrupted with ``--eval_splits all`` does not resume with ``selection`` (its
    records would mix the two), and the other way round; nothing is changed."""
    for first, second in (("all", "selection"), ("selection", "all")):
        out = tmp_path / first
        argv = ["--dataset", "Debug28", "--steps", "6", "--checkpoint_freq", "2",
                "--hparams", '{"batch_size": 8}', "--output_dir", str(out)]
        first_argv = argv + (["--eval_splits", "selection"] if first == "selection" else [])
        assert train_run.run(train_cli.build_parser().parse_args(first_argv),
                             stop_after_step=2) == "stopped"
        before = (out / "results.jsonl").read_bytes()
        code = train_cli.main(argv + ["--resume", "--eval_splits", second])
        assert code == 2
        err = (out / "err.txt").read_text()
        default = {"all": " (the default)", "selection": ""}  # train's default: all
        assert (f"--eval_splits: '{first}' in the checkpoint{default[first]}, '{second}' "
                f"now{default[second]}") in err
        assert (out / "results.jsonl").read_bytes() == before


def test_the_evaluation_batch_size_is_recorded_when_not_domainbeds(tmp_path):
    """``--eval_batch_size`` enters the records' args when it is not 64 (visible, and a resume
    with another value is refused), and never when it is."""
    for size, recorded in ((64, False), (32, True)):
        out = tmp_path / str(size)
        assert train_cli.main(["--dataset", "Debug28", "--steps", "1", "--hparams",
                               '{"batch_size": 8}', "--output_dir", str(out),
                               "--eval_batch_size", str(size)]) == 0
        (record,) = read_records(out)
        assert record["args"].get("eval_batch_size") == (size if recorded else None)
    assert train_cli.main(["--dataset", "Debug28", "--eval_batch_size", "0", "--output_dir",
                           str(tmp_path / "zero")]) == 2


class _Recorder(torch.nn.Module):
    """An algorithm stand-in: predicts class 0, and records each batch's size and whether it
    ran under ``torch.inference_mode``."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def predict(self, x):
        self.calls.append((len(x), torch.is_inference_mode_enabled()))
        return torch.zeros(len(x), 2)


def test_evaluation_runs_in_inference_mode_in_batches_of_its_size():
    data = TensorDataset(torch.zeros(150, 1), torch.zeros(150, dtype=torch.long))
    for size, expected in ((64, [64, 64, 22]), (100, [100, 50])):
        model = _Recorder()
        (accs,) = accuracies(model, [(data, 0, None)], torch.device("cpu"), batch_size=size)
        assert accs[""] == 1.0 and model.calls == [(n, True) for n in expected]
        assert model.training  # train mode restored


@pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true")
def test_pinned_memory_and_non_blocking_copies_only_for_cuda(monkeypatch):
    """Batches bound for a CUDA device come from pinned memory (the pool's loader) and are
    copied non-blocking; for the CPU neither."""
    assert batches.cuda_transfers(torch.device("cuda")) and batches.cuda_transfers("cuda:1")
    assert not batches.cuda_transfers(torch.device("cpu")) and not batches.cuda_transfers("cpu")
    made = []

    class Recording(DataLoader):
        def __init__(self, *args, **kwargs):
            made.append(kwargs["pin_memory"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(batches, "DataLoader", Recording)
    for device in ("cuda", "cpu"):
        stream = batches.BatchStream(_Items(8), 2, seed=0)
        pool = batches.share_workers([stream], 1, pin_memory=batches.cuda_transfers(device))
        try:
            next(stream)
        finally:
            pool.close()
    assert made == [True, False]


class _Items(Dataset):
    """Items read one by one (not in-memory tensors, so a loader's workers make them), each with
    a random draw, as an augmented image dataset has."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item()]), i % 2


def test_one_pool_serves_training_rounds_and_evaluations():
    """Two training streams and two evaluation datasets share one pool of two workers: rounds,
    an evaluation in the middle (the rounds in flight stay buffered), more rounds and a last
    evaluation after the streams' last batch (:attr:`WorkerPool.limit`) give exactly the batches
    made in-process, and the workers are never restarted."""
    train = [_Items(10), _Items(12)]
    evaluation = [_Items(7), _Items(5)]
    requests = [[(d, seed, list(range(0, len(d), 2)))] for seed, d in enumerate(evaluation)]

    def expected_round(streams):
        return [next(s) for s in streams]

    in_process = [batches.BatchStream(d, 3, seed=k) for k, d in enumerate(train)]
    streams = [batches.BatchStream(d, 3, seed=k) for k, d in enumerate(train)]
    pool = batches.share_workers(streams, 2, datasets=evaluation)
    pool.limit = 6
    try:
        def same(a, b):
            assert all(torch.equal(x, y) for x, y in zip(a, b))

        for _ in range(3):
            for got, want in zip(expected_round(streams), expected_round(in_process)):
                same(got, want)
        workers = [w.pid for w in pool.workers]
        for (got,), request in zip(pool.serve(requests), requests):
            (dataset, seed, indices), = request
            same(got, batches.fetch(dataset, indices, seed))
        for _ in range(3):
            for got, want in zip(expected_round(streams), expected_round(in_process)):
                same(got, want)
        for (got,), ((dataset, seed, indices),) in zip(pool.serve(requests), requests):
            same(got, batches.fetch(dataset, indices, seed))
        assert [w.pid for w in pool.workers] == workers and len(workers) == 2
        with pytest.raises(RuntimeError, match="drawn past their 6 batches"):
            next(streams[0])
    finally:
        pool.close()
