"""Splits (DomainBed's), resumable batch streams, evaluation, class-balanced weights."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from dg_plugins.seeds import seed_hash
from dg_plugins.train import batches, evaluate
from dg_plugins.train import splits as split_lib


def tensor_env(n=20, classes=(0, 1)):
    return TensorDataset(torch.arange(n, dtype=torch.float).view(n, 1),
                         torch.tensor([classes[i % len(classes)] for i in range(n)]))


def test_split_is_domainbeds_holdout_first():
    env = tensor_env(20)
    out, in_ = split_lib.split_dataset(env, 4, seed_hash(0, 1))
    expected = np.random.RandomState(seed_hash(0, 1)).permutation(20).tolist()
    assert out.keys == expected[:4] and in_.keys == expected[4:]


def test_tensor_view_composes_nested_splits():
    env = tensor_env(20)
    _, in_ = split_lib.split_dataset(env, 4, 1)
    uda, rest = split_lib.split_dataset(in_, 3, 2)
    tensors, index = split_lib.tensor_view(rest)
    assert [int(tensors[0][i]) for i in index] == [int(rest[j][0]) for j in range(len(rest))]


def test_batch_stream_resumes_exactly_and_allows_large_batches():
    env = tensor_env(5)
    stream = batches.BatchStream(env, batch_size=16, seed=3)  # batch > split: no hang
    first = [next(stream)[0] for _ in range(3)]
    state = stream.state_dict()
    after = [next(stream)[0] for _ in range(2)]
    resumed = batches.BatchStream(env, batch_size=16, seed=99)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(after, [next(resumed)[0] for _ in range(2)]))
    assert first[0].shape == (16, 1)


def test_batch_stream_without_tensor_view_matches_the_fast_path():
    class Plain(torch.utils.data.Dataset):
        def __init__(self, env):
            self.env = env

        def __len__(self):
            return len(self.env)

        def __getitem__(self, i):
            return self.env[i]

    env = tensor_env(9)
    fast = batches.BatchStream(env, 4, seed=1)
    slow = batches.BatchStream(Plain(env), 4, seed=1)
    for _ in range(3):
        (xf, yf), (xs, ys) = next(fast), next(slow)
        assert torch.equal(xf, xs) and torch.equal(yf, ys)


def test_accuracy_with_subsets_and_train_mode_restored():
    class Echo(torch.nn.Module):
        def predict(self, x):  # predicts class 1 for even inputs
            return torch.stack([x[:, 0] % 2, 1 - x[:, 0] % 2], dim=1)

    env = tensor_env(10)  # labels alternate 0, 1 -> even inputs have label 0
    model = Echo()
    accs = evaluate.accuracy(model, env, "cpu", batch_size=3,
                         subsets={"first": torch.arange(10) < 4, "none": torch.zeros(10)})
    assert accs[""] == 0.0 and accs["first"] == 0.0 and np.isnan(accs["none"])
    assert model.training


def test_class_balanced_weights():
    env = tensor_env(8, classes=(0, 0, 0, 1))  # class 1 is 3x rarer
    w = split_lib.class_balanced_weights(env)
    assert torch.isclose(w.sum(), torch.tensor(1.0, dtype=w.dtype))
    assert torch.isclose(w[3], 3 * w[0])


class ItemEnv(torch.utils.data.Dataset):
    """A dataset without a tensor view, so streams and evaluation use loader workers."""

    def __init__(self, n=20):
        self.env = tensor_env(n)

    def __len__(self):
        return len(self.env)

    def __getitem__(self, i):
        return self.env[i]


def worker_pids(iterator):
    return [w.pid for w in iterator._workers]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_closing_a_worker_stream_ends_its_workers_and_keeps_its_position():
    """Workers prefetch ahead; close() ends them (although they ignore SIGTERM), and the stream
    continues with exactly the batches an uninterrupted stream draws."""
    reference = batches.BatchStream(ItemEnv(), 3, seed=5)
    expected = [next(reference)[0].flatten().tolist() for _ in range(6)]
    stream = batches.BatchStream(ItemEnv(), 3, seed=5, num_workers=2)
    got = [next(stream)[0].flatten().tolist() for _ in range(3)]
    pids = [w.pid for w in stream.pool.workers]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert stream.state_dict()["drawn"] == 3  # what a checkpoint records: used, not prefetched
    stream.close()
    assert not any(alive(p) for p in pids)
    assert stream.state_dict()["drawn"] == 3
    got += [next(stream)[0].flatten().tolist() for _ in range(3)]  # new workers
    stream.close()
    assert got == expected


def test_an_evaluation_stopped_early_ends_its_workers():
    made = evaluate.eval_batches(ItemEnv(40), 4, num_workers=2)
    next(made)
    iterator = made.gi_frame.f_locals["each"].gi_frame.f_locals["iterator"]
    pids = worker_pids(iterator)
    assert all(alive(p) for p in pids)
    made.close()
    assert not any(alive(p) for p in pids)
    assert iterator not in batches._OPEN_WORKER_ITERATORS


def test_the_exit_handler_ends_worker_loaders_left_open():
    stream = batches.BatchStream(ItemEnv(), 3, seed=1, num_workers=1)
    next(stream)
    pids = [w.pid for w in stream.pool.workers]
    batches._shutdown_open_workers()
    assert not any(alive(p) for p in pids)


class OfficialSplitToy:
    """A toy multi-environment dataset whose environment 1 has a predefined in/out split (as
    PACS's official lists), the others none."""

    def __init__(self, pairs):
        self.datasets = [tensor_env(10), tensor_env(12), tensor_env(8)]
        self.pairs = pairs

    def __len__(self):
        return len(self.datasets)

    def __getitem__(self, i):
        return self.datasets[i]

    def predefined_split(self, env_index):
        return self.pairs.get(env_index)


def split_args(**changes):
    import argparse

    values = dict(holdout_fraction=0.2, uda_holdout_fraction=0.5, trial_seed=0, test_envs=[1],
                  task="domain_generalization")
    return argparse.Namespace(**{**values, **changes})


def test_a_predefined_split_replaces_the_random_holdout_of_its_environment(capsys):
    from dg_plugins.train.splits import Splits

    toy = OfficialSplitToy({1: ([0, 2, 4, 6, 8, 10], [1, 3, 5])})
    splits = Splits(toy, split_args(), {"class_balanced": False})
    (in0, _), (in1, _), (in2, _) = splits.in_splits
    out1 = splits.out_splits[1][0]
    assert sorted(split_lib.env_indices(out1).tolist()) == [1, 3, 5]
    # test env 1: its uda half comes from the predefined in-split, as from a random one
    uda1 = splits.uda_splits[0][0]
    assert sorted(split_lib.env_indices(in1).tolist() + split_lib.env_indices(uda1).tolist()) == [
        0, 2, 4, 6, 8, 10]
    assert len(uda1) == 3
    # the other environments keep DomainBed's random holdout
    random0 = split_lib.split_dataset(toy[0], 2, seed_hash(0, 0))
    assert split_lib.env_indices(splits.out_splits[0][0]).tolist() == random0[0].keys
    assert split_lib.env_indices(in2).tolist() == split_lib.split_dataset(toy[2], 1, seed_hash(0, 2))[1].keys
    assert "env1 uses the dataset's predefined split (6 in, 3 out)" in capsys.readouterr().out


def test_a_test_environment_may_validate_on_part_of_its_in_split_a_training_one_may_not():
    """PACS's official lists: the target's test list holds every image and its crossval list a
    subset; the target is only evaluated, so both splits are kept whole. A training
    environment's overlap would train on its validation items: refused, naming the fix."""
    from dg_plugins.train.splits import Splits

    pair = (list(range(12)), [1, 3, 5])
    splits = Splits(OfficialSplitToy({1: pair}), split_args(uda_holdout_fraction=0.0),
                    {"class_balanced": False})
    assert sorted(split_lib.env_indices(splits.in_splits[1][0]).tolist()) == list(range(12))
    assert sorted(split_lib.env_indices(splits.out_splits[1][0]).tolist()) == [1, 3, 5]
    with pytest.raises(ValueError, match=r"puts items \[1, 3, 5\] in both the in- and the "
                                         r"out-split of training environment 1.*disjoint"):
        Splits(OfficialSplitToy({1: pair}), split_args(test_envs=[0]), {"class_balanced": False})


@pytest.mark.parametrize("pair, message", [
    (([0, 12], [1]), r"names items \[12\] outside the environment's 12 items"),
    (([], [1]), "empty in-split"),
    ([0, 1, 2], r"must return \(in_indices, out_indices\) or None"),
])
def test_a_bad_predefined_split_is_a_clear_error(pair, message):
    from dg_plugins.train.splits import Splits

    with pytest.raises(ValueError, match=message):
        Splits(OfficialSplitToy({1: pair}), split_args(), {"class_balanced": False})


class Augmenting(torch.utils.data.Dataset):
    """Items whose ``__getitem__`` draws from torch, ``random`` and ``numpy.random`` (as image
    augmentations do)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        import random

        noise = torch.rand(1).item() + random.random() + float(np.random.rand())
        return torch.tensor([float(i), noise]), i % 2


@pytest.mark.parametrize("workers", [0, 2])
def test_augmented_batches_depend_on_seed_and_batch_index_only(workers):
    """Training and evaluation batches of an augmenting dataset are the same with and without
    loader workers, across a close (new workers) and for a repeated evaluation, differ between
    batches and seeds, and leave the main process's RNGs where they were."""
    import random

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    before = (torch.rand(1), random.random(), np.random.rand())
    torch.manual_seed(0), random.seed(0), np.random.seed(0)

    def train_batches(num_workers, n, seed=4):
        stream = batches.BatchStream(Augmenting(), 3, seed=seed, num_workers=num_workers)
        got = [next(stream)[0] for _ in range(n // 2)]
        stream.close()
        got += [next(stream)[0] for _ in range(n - n // 2)]
        stream.close()
        return torch.stack(got)

    def evaluation(num_workers, seed=5):
        return torch.cat([x for x, _ in evaluate.eval_batches(Augmenting(), 4, num_workers, seed)])

    ours = train_batches(workers, 6)
    assert torch.equal(ours, train_batches(0, 6))
    assert not torch.equal(ours[0, :, 1], ours[1, :, 1])  # batches get different draws
    assert not torch.equal(ours, train_batches(0, 6, seed=8))
    assert torch.equal(evaluation(workers), evaluation(0))
    assert torch.equal(evaluation(workers)[:, 0], torch.arange(10.0))
    assert not torch.equal(evaluation(0), evaluation(0, seed=6))
    assert (torch.rand(1), random.random(), np.random.rand()) == before


def test_one_loader_evaluates_several_splits_in_order(monkeypatch):
    """``accuracies`` of item-read and in-memory splits: one worker loader (2 workers) for all,
    the same numbers as each split evaluated alone in-process."""
    class Parity(torch.nn.Module):
        def predict(self, x):  # class 1 for odd first features
            return torch.stack([1 - x[:, 0] % 2, x[:, 0] % 2], dim=1)

    splits = [(ItemEnv(9), 1, None), (tensor_env(7), 2, {"head": torch.arange(7) < 3}),
              (Augmenting(), 3, None), (ItemEnv(5), 4, None)]
    started = []
    real = batches.worker_loader
    monkeypatch.setattr(evaluate, "worker_loader", lambda *a: started.append(a) or real(*a))
    together = evaluate.accuracies(Parity(), splits, "cpu", batch_size=4, num_workers=2)
    monkeypatch.undo()
    alone = [evaluate.accuracy(Parity(), d, "cpu", batch_size=4, subsets=s, seed=seed)
             for d, seed, s in splits]
    assert together == alone and len(started) == 1
    assert together[0][""] == 1.0 and set(together[1]) == {"", "head"}
