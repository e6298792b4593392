"""Splits (DomainBed's), resumable batch streams, evaluation, class-balanced weights."""

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dg_plugins.engine import data
from dg_plugins.seeds import seed_hash


def tensor_env(n=20, classes=(0, 1)):
    return TensorDataset(torch.arange(n, dtype=torch.float).view(n, 1),
                         torch.tensor([classes[i % len(classes)] for i in range(n)]))


def test_split_is_domainbeds_holdout_first():
    env = tensor_env(20)
    out, in_ = data.split_dataset(env, 4, seed_hash(0, 1))
    expected = np.random.RandomState(seed_hash(0, 1)).permutation(20).tolist()
    assert out.keys == expected[:4] and in_.keys == expected[4:]


def test_tensor_view_composes_nested_splits():
    env = tensor_env(20)
    _, in_ = data.split_dataset(env, 4, 1)
    uda, rest = data.split_dataset(in_, 3, 2)
    tensors, index = data.tensor_view(rest)
    assert [int(tensors[0][i]) for i in index] == [int(rest[j][0]) for j in range(len(rest))]


def test_batch_stream_resumes_exactly_and_allows_large_batches():
    env = tensor_env(5)
    stream = data.BatchStream(env, batch_size=16, seed=3)  # batch > split: no hang
    first = [next(stream)[0] for _ in range(3)]
    state = stream.state_dict()
    after = [next(stream)[0] for _ in range(2)]
    resumed = data.BatchStream(env, batch_size=16, seed=99)
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
    fast = data.BatchStream(env, 4, seed=1)
    slow = data.BatchStream(Plain(env), 4, seed=1)
    for _ in range(3):
        (xf, yf), (xs, ys) = next(fast), next(slow)
        assert torch.equal(xf, xs) and torch.equal(yf, ys)


def test_accuracy_with_subsets_and_train_mode_restored():
    class Echo(torch.nn.Module):
        def predict(self, x):  # predicts class 1 for even inputs
            return torch.stack([x[:, 0] % 2, 1 - x[:, 0] % 2], dim=1)

    env = tensor_env(10)  # labels alternate 0, 1 -> even inputs have label 0
    model = Echo()
    accs = data.accuracy(model, env, "cpu", batch_size=3,
                         subsets={"first": torch.arange(10) < 4, "none": torch.zeros(10)})
    assert accs[""] == 0.0 and accs["first"] == 0.0 and np.isnan(accs["none"])
    assert model.training


def test_class_balanced_weights():
    env = tensor_env(8, classes=(0, 0, 0, 1))  # class 1 is 3x rarer
    w = data.class_balanced_weights(env)
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
    reference = data.BatchStream(ItemEnv(), 3, seed=5)
    expected = [next(reference)[0].flatten().tolist() for _ in range(6)]
    stream = data.BatchStream(ItemEnv(), 3, seed=5, num_workers=2)
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
    batches = data.eval_batches(ItemEnv(40), 4, num_workers=2)
    next(batches)
    iterator = batches.gi_frame.f_locals["iterator"]
    pids = worker_pids(iterator)
    assert all(alive(p) for p in pids)
    batches.close()
    assert not any(alive(p) for p in pids)
    assert iterator not in data._OPEN_WORKER_ITERATORS


def test_the_exit_handler_ends_worker_loaders_left_open():
    stream = data.BatchStream(ItemEnv(), 3, seed=1, num_workers=1)
    next(stream)
    pids = [w.pid for w in stream.pool.workers]
    data._shutdown_open_workers()
    assert not any(alive(p) for p in pids)
