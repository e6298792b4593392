"""``batch_sampling`` "pooled" (the DMG release's loader: one shuffled batch from the union of the
source splits, each item once per epoch, the last batch of an epoch partial): what an epoch
draws, exact resume mid-epoch (in-process and with loader workers), empty per-domain minibatches
for ERM and DMG, and the epoch length a pooled job records."""

import collections

import pytest
import torch
from torch.utils.data import TensorDataset

import dg_plugins.datasets  # noqa: F401  (registers Debug28)
from dg_plugins.algorithms import ERM
from dg_plugins.algorithms.dmg import DMG
from dg_plugins.train import batches
from dg_plugins.train import run as train
from dg_plugins.registry import DATASETS
from dg_plugins.scripts.train import build_parser
from support.helpers import read_records, tiny_hparams

SIZES = (5, 9, 3)  # 17 items: 5 batches of 4 per epoch, the last one holding 1 item


def tensor_splits(sizes=SIZES):
    """Environment splits whose items are their (domain, position) codes ``100 d + i``."""
    return [TensorDataset(torch.tensor([[100.0 * d + i] for i in range(n)]),
                          torch.full((n,), d)) for d, n in enumerate(sizes)]


class Plain(torch.utils.data.Dataset):
    """The same items without a tensor view (read item by item, in loader workers if any)."""

    def __init__(self, split):
        self.split = split

    def __len__(self):
        return len(self.split)

    def __getitem__(self, i):
        return self.split[i]


def codes(minibatches):
    return [[int(v) for v in x.flatten()] for x, _ in minibatches]


def test_an_epoch_draws_every_item_once_so_domain_shares_follow_sizes():
    stream = batches.PooledBatches(tensor_splits(), 4, seed=3)
    assert stream.batches_per_epoch == 5
    epochs = []
    for _ in range(2):
        drawn, sizes = [], []
        for _ in range(stream.batches_per_epoch):
            minibatches = next(stream)
            assert len(minibatches) == 3
            for d, ((x, y), items) in enumerate(zip(minibatches, codes(minibatches))):
                assert all(v // 100 == d for v in items) and (y == d).all()  # its own domain
            drawn += sum(codes(minibatches), [])
            sizes.append(sum(len(y) for _, y in minibatches))
        assert sizes == [4, 4, 4, 4, 1]
        assert sorted(drawn) == sorted(100 * d + i for d, n in enumerate(SIZES) for i in range(n))
        assert collections.Counter(v // 100 for v in drawn) == dict(enumerate(SIZES))
        epochs.append(drawn)
    assert epochs[0] != epochs[1]  # a new permutation every epoch


def test_every_domain_share_follows_its_size_and_empty_minibatches_keep_their_shape():
    stream = batches.PooledBatches(tensor_splits((40, 8)), 6, seed=0)
    counts, empty = torch.zeros(2), 0
    for _ in range(stream.batches_per_epoch):
        minibatches = next(stream)
        for d, (x, y) in enumerate(minibatches):
            counts[d] += len(y)
            if len(y) == 0:
                empty += 1
                assert x.shape == (0, 1) and y.dtype == torch.long
    assert counts.tolist() == [40, 8] and empty > 0  # the small domain misses some batches


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_draws_the_batches_of_an_uninterrupted_stream(workers):
    """Reference: the in-memory fast path, uninterrupted. A stream of the same items read one by
    one (in loader workers, or in-process) is stopped mid-epoch, restored from its state into a
    new stream, and closed once more (its workers prefetched ahead) in the next epoch."""
    reference = batches.PooledBatches(tensor_splits(), 4, seed=7)
    expected = [codes(next(reference)) for _ in range(12)]
    plain = [Plain(s) for s in tensor_splits()]
    first = batches.PooledBatches(plain, 4, seed=7, num_workers=workers)
    got = [codes(next(first)) for _ in range(3)]
    state = first.state_dict()
    first.close()
    resumed = batches.PooledBatches(plain, 4, seed=123, num_workers=workers)
    resumed.load_state_dict(state)
    got += [codes(next(resumed)) for _ in range(4)]
    resumed.close()
    got += [codes(next(resumed)) for _ in range(5)]
    resumed.close()
    assert got == expected


def test_streams_sharing_one_pool_match_their_own_in_process_batches():
    """The per-domain streams and a pooled one served by one worker pool (rounds of one batch
    each) give what each gives alone in-process; a close mid-way loses nothing."""
    splits = [Plain(s) for s in tensor_splits()]

    def streams(workers):
        made = [batches.BatchStream(s, 3, seed=i) for i, s in enumerate(splits)]
        made.append(batches.PooledBatches(splits, 4, seed=9))
        batches.share_workers(made, workers)
        return made

    def draw(made, n):
        out = []
        for _ in range(n):
            out.append([next(s)[0].flatten().tolist() for s in made[:3]] + [codes(next(made[3]))])
        return out

    alone, shared = streams(0), streams(2)
    assert shared[0].pool is shared[3].pool and len(shared[0].pool.streams) == 4
    got = draw(shared, 2)
    pids = [w.pid for w in shared[0].pool.workers]
    assert len(pids) == 2
    shared[1].close()  # ends the one pool of all four
    assert not shared[0].pool.workers
    got += draw(shared, 3)
    shared[0].close()
    assert got == draw(alone, 5)


def debug28_minibatches(sizes):
    torch.manual_seed(0)
    dataset = DATASETS.get("Debug28")("", [], {})
    return [(dataset[i].tensors[0][:n], dataset[i].tensors[1][:n]) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("cls", [ERM, DMG])
def test_an_empty_minibatch_works_with_erm_and_dmg(cls):
    """A pooled batch may hold no item of some domain; the update runs on the others, and DMG
    still gives the samples of domain 2 the masks of domain 2 (the minibatch's position)."""
    hp = tiny_hparams(cls.__name__, "Debug28", mnist_cnn_width=16)
    torch.manual_seed(0)
    algorithm = cls((3, 28, 28), 2, 3, hp)
    minibatches = debug28_minibatches([3, 0, 2])
    assert minibatches[1][0].shape == (0, 3, 28, 28)
    before = {n: p.detach().clone() for n, p in algorithm.named_parameters()}
    out = algorithm.update(minibatches)
    assert all(torch.isfinite(torch.tensor(v)) for v in out.values())
    changed = [n for n, p in algorithm.named_parameters() if not torch.equal(p, before[n])]
    assert changed  # it learned from the 5 samples
    if cls is DMG:
        from dg_plugins.algorithms.base import split_minibatches

        assert split_minibatches(minibatches)[2].tolist() == [0, 0, 0, 2, 2]


def test_a_pooled_job_records_epochs_of_the_union_and_resumes_exactly(tmp_path):
    """Debug28 with test env 0: two source in-splits of 13 items (26), batch 4: 7 steps an epoch
    (the last batch holds 2 items). DMG trains on the pooled batches; a run stopped at step 4 and
    resumed writes the records of an uninterrupted one."""

    def args(out, *extra):
        return build_parser().parse_args([
            "--dataset", "Debug28", "--algorithm", "DMG", "--test_envs", "0", "--steps", "10",
            "--checkpoint_freq", "4", "--output_dir", str(out), "--hparams",
            '{"batch_sampling": "pooled", "batch_size": 4, "mnist_cnn_width": 16}', *extra])

    assert train.run(args(tmp_path / "full")) == "done"
    assert train.run(args(tmp_path / "cut"), stop_after_step=4) == "stopped"
    assert train.run(args(tmp_path / "cut", "--resume")) == "done"
    full, cut = (read_records(tmp_path / name, drop=("step_time", "mem_gb", "args"))
                 for name in ("full", "cut"))
    assert [r["step"] for r in full] == [0, 4, 8, 9] and cut == full
    assert [r["epoch"] for r in full] == [0.0, 4 / 7, 8 / 7, 9 / 7]
    assert full[-1]["num_classes"] == 2


def test_pooled_sampling_refuses_class_balanced_sampling(tmp_path):
    args = build_parser().parse_args([
        "--dataset", "Debug28", "--steps", "2", "--output_dir", str(tmp_path), "--hparams",
        '{"batch_sampling": "pooled", "class_balanced": true}'])
    with pytest.raises(ValueError, match="pooled' draws every item once per epoch.*class_balanced"):
        train.run(args)
