"""Splits, training batch streams and evaluation for the train loop (``domainbed/scripts/train.py``, ``domainbed/lib/misc.py``).

Differences from DomainBed, by design:
* Training batches are drawn i.i.d. with replacement from each environment's in-split (DomainBed's
  sampler also draws with replacement), one ``randint`` per batch from a per-loader generator. A
  batch larger than the split therefore just repeats samples; DomainBed hangs forever there.
* The stream's state is (seed, batches drawn), so a resumed job draws exactly the batches an
  uninterrupted job would.
* In-memory tensor datasets are gathered in-process by tensor indexing (no worker processes).
  Other datasets use at most ``min(N_WORKERS, cpus)`` workers shared across the training loaders;
  random augmentations in worker processes are not replayed exactly after a resume.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SplitDataset(Dataset):
    """The items ``keys`` of ``underlying`` (an index-remapping view)."""

    def __init__(self, underlying: Dataset, keys):
        self.underlying = underlying
        self.keys = list(keys)

    def __getitem__(self, index):
        return self.underlying[self.keys[index]]

    def __len__(self):
        return len(self.keys)


def split_dataset(dataset: Dataset, n: int, seed: int = 0):
    """``(first n, rest)`` of a ``RandomState(seed)`` shuffle of the indices (``misc.split_dataset``); train.py
    uses the first part as the holdout ("out") split."""
    if n > len(dataset):
        raise ValueError(f"cannot hold out {n} of {len(dataset)} samples")
    keys = np.random.RandomState(seed).permutation(len(dataset)).tolist()
    return SplitDataset(dataset, keys[:n]), SplitDataset(dataset, keys[n:])


def env_indices(dataset: Dataset) -> np.ndarray:
    """The positions, in the underlying environment dataset, of the items of ``dataset`` (a
    possibly nested :class:`SplitDataset`; a plain dataset maps to ``0..len-1``)."""
    index = None
    while isinstance(dataset, SplitDataset):
        keys = np.asarray(dataset.keys, dtype=np.int64)
        index = keys if index is None else keys[index]
        dataset = dataset.underlying
    return np.arange(len(dataset)) if index is None else index


def tensor_view(dataset: Dataset):
    """``(tensors, index)`` when ``dataset`` is a (nested) split of a TensorDataset, else None."""
    index = None
    while isinstance(dataset, SplitDataset):
        keys = torch.as_tensor(dataset.keys, dtype=torch.long)
        index = keys if index is None else keys[index]
        dataset = dataset.underlying
    if not isinstance(dataset, TensorDataset):
        return None
    if index is None:
        index = torch.arange(len(dataset))
    return dataset.tensors, index


def worker_budget(dataset_n_workers: int) -> int:
    """Worker processes for a job: none beyond the machine's cores or the dataset's own cap."""
    return max(0, min(dataset_n_workers, os.cpu_count() or 1))


def _ignore_stop_signals(worker_id: int) -> None:
    """Loader workers ignore SIGTERM/SIGINT: a signal to the whole process group (Ctrl-C, a
    sweep forwarding Slurm's SIGTERM) must reach only the train process, which stops at a step
    boundary and then ends its workers itself."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _collate(items):
    xs, ys = zip(*items)
    return torch.stack(list(xs)), torch.as_tensor(ys)


class _IndexBatches:
    """An endless iterator of index batches, drawn from ``generator``."""

    def __init__(self, stream: "BatchStream"):
        self.stream = stream

    def __iter__(self):
        while True:
            yield self.stream.next_indices().tolist()


class BatchStream:
    """Endless i.i.d. training batches of one environment split (with replacement, optionally
    class-weighted). ``state_dict`` is the number of batches drawn; restoring replays the draws."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, weights=None,
                 num_workers: int = 0):
        if len(dataset) == 0:
            raise ValueError("cannot train on an empty environment split")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.double)
        self.num_workers = num_workers
        self.view = tensor_view(dataset)
        self._reset(0)

    def _reset(self, drawn: int):
        self.generator = torch.Generator().manual_seed(self.seed)
        self.drawn = 0
        for _ in range(drawn):
            self.next_indices()
        self._loader_iter = None

    def next_indices(self) -> torch.Tensor:
        self.drawn += 1
        if self.weights is not None:
            return torch.multinomial(self.weights, self.batch_size, replacement=True,
                                     generator=self.generator)
        return torch.randint(len(self.dataset), (self.batch_size,), generator=self.generator)

    def __next__(self):
        if self.view is not None:
            tensors, index = self.view
            picked = index[self.next_indices()]
            return tensors[0][picked], tensors[1][picked]
        if self.num_workers == 0:
            return _collate([self.dataset[i] for i in self.next_indices().tolist()])
        if self._loader_iter is None:
            loader = DataLoader(self.dataset, batch_sampler=_IndexBatches(self),
                                num_workers=self.num_workers, collate_fn=_collate,
                                persistent_workers=True, prefetch_factor=2,
                                worker_init_fn=_ignore_stop_signals)
            self._loader_iter = iter(loader)
            self._consumed_at_start = self.drawn
            self._consumed = 0
        self._consumed += 1
        return next(self._loader_iter)

    def state_dict(self) -> dict:
        consumed = self.drawn
        if self._loader_iter is not None:  # the worker loader prefetches; count what we used
            consumed = self._consumed_at_start + self._consumed
        return {"seed": self.seed, "drawn": consumed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self._reset(state["drawn"])

    def __iter__(self):
        return self


def eval_batches(dataset: Dataset, batch_size: int, num_workers: int):
    """The evaluation batches of ``dataset`` in order."""
    view = tensor_view(dataset)
    if view is not None:
        tensors, index = view
        for start in range(0, len(index), batch_size):
            picked = index[start:start + batch_size]
            yield tensors[0][picked], tensors[1][picked]
        return
    yield from DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                          collate_fn=_collate,
                          worker_init_fn=_ignore_stop_signals if num_workers else None)


@torch.no_grad()
def accuracy(algorithm, dataset: Dataset, device, batch_size: int = 64, num_workers: int = 0,
             subsets: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Top-1 accuracy of ``algorithm.predict`` on ``dataset`` (``misc.accuracy``), in eval mode, restoring
    train mode after. ``subsets`` maps a name to a boolean mask over the dataset's items; each named
    subset's accuracy is returned too (NaN when it is empty). Key ``""`` is the whole dataset."""
    algorithm.eval()
    hits = []
    try:
        for x, y in eval_batches(dataset, batch_size, num_workers):
            logits = algorithm.predict(x.to(device))
            if logits.dim() != 2 or logits.size(1) < 2:
                raise ValueError(f"predict() must return [N, num_classes>=2] logits, got shape "
                                 f"{tuple(logits.shape)}")
            hits.append((logits.argmax(1) == y.to(device)).cpu())
    finally:
        algorithm.train()
    correct = torch.cat(hits).double() if hits else torch.zeros(0, dtype=torch.double)
    out = {"": correct.mean().item() if len(correct) else float("nan")}
    for name, mask in (subsets or {}).items():
        picked = correct[torch.as_tensor(mask, dtype=torch.bool)]
        out[name] = picked.mean().item() if len(picked) else float("nan")
    return out


def class_balanced_weights(dataset: Dataset) -> torch.Tensor:
    """Per-sample weights ``1 / (count[c] * n_classes_present)`` (``misc.make_weights_for_balanced_classes``), summing to 1."""
    view = tensor_view(dataset)
    labels = (view[0][1][view[1]] if view is not None
              else torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))]))
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (counts[inverse].double() * len(classes))
