"""Data for the train loop: the in/out split of an environment, training batch streams, evaluation
batches and accuracy (``domainbed/lib/misc.py``, ``domainbed/lib/fast_data_loader.py``). Which
splits a job makes and evaluates is :class:`dg_plugins.engine.splits.Splits`.

Differences from DomainBed, by design:
* Training batches are drawn i.i.d. with replacement from each environment's in-split (DomainBed's
  sampler also draws with replacement), one ``randint`` per batch from a per-loader generator. A
  batch larger than the split therefore just repeats samples; DomainBed hangs forever there.
* The stream's state is (seed, batches drawn), so a resumed job draws exactly the batches an
  uninterrupted job would.
* In-memory tensor datasets are gathered in-process by tensor indexing (no worker processes).
  Other datasets use at most ``min(N_WORKERS, cpus)`` workers shared across the training loaders;
  random augmentations in worker processes are not replayed exactly after a resume.

Loader workers (the lifecycle): workers ignore SIGTERM/SIGINT, so that a signal sent to the job's
whole process group (Ctrl-C, a sweep forwarding Slurm's SIGTERM, Slurm signalling every process)
reaches only the train process, which stops at a step boundary with a checkpoint. Because they
ignore SIGTERM, multiprocessing's exit handler (terminate, then join) cannot end them, so the
owner must: :meth:`BatchStream.close` and the evaluation iterator of :func:`eval_batches` shut
their workers down through the loader's own protocol (done event, then join), and kill any that
did not exit. The train job closes its streams on every exit path; as a last resort, an exit
handler of this module (it runs before multiprocessing's and torch's, being registered after
them) closes whatever worker loader is still open, so no process can hang at exit or leave a
worker behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref

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


#: Worker iterators not yet shut down (see the module docstring).
_OPEN_WORKER_ITERATORS: "weakref.WeakSet" = weakref.WeakSet()


def _start_workers(loader: DataLoader):
    """``iter(loader)``, tracked until :func:`shutdown_workers` ends its workers."""
    iterator = iter(loader)
    if getattr(iterator, "_workers", None):
        _OPEN_WORKER_ITERATORS.add(iterator)
    return iterator


def shutdown_workers(iterator, timeout: float = 5.0) -> None:
    """End the worker processes of a DataLoader iterator: the loader's own shutdown (done event,
    a sentinel per worker, join), then SIGKILL for any worker still alive (ours ignore SIGTERM,
    which is all the loader's fallback sends). Idempotent; a no-op for an in-process iterator."""
    _OPEN_WORKER_ITERATORS.discard(iterator)
    workers = list(getattr(iterator, "_workers", None) or [])
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(timeout)


@atexit.register
def _shutdown_open_workers() -> None:
    for iterator in list(_OPEN_WORKER_ITERATORS):
        shutdown_workers(iterator)


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
                                prefetch_factor=2, worker_init_fn=_ignore_stop_signals)
            self._consumed_at_start = self.drawn  # before iter(): it prefetches at once
            self._consumed = 0
            self._loader_iter = _start_workers(loader)
        self._consumed += 1
        return next(self._loader_iter)

    def _batches_used(self) -> int:
        if self._loader_iter is not None:  # the worker loader prefetches; count what we used
            return self._consumed_at_start + self._consumed
        return self.drawn

    def state_dict(self) -> dict:
        return {"seed": self.seed, "drawn": self._batches_used()}

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.seed = state["seed"]
        self._reset(state["drawn"])

    def close(self) -> None:
        """Shut down this stream's loader workers, if any. The stream stays usable: its position
        is kept (prefetched batches are drawn again), and the next batch starts new workers."""
        iterator = self._loader_iter
        if iterator is None:
            return
        used = self._batches_used()
        self._loader_iter = None
        shutdown_workers(iterator)
        self._reset(used)

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        return self


def eval_batches(dataset: Dataset, batch_size: int, num_workers: int):
    """The evaluation batches of ``dataset`` in order. With workers, close the generator when
    stopping early (``contextlib.closing``): its workers are shut down then, not at garbage
    collection."""
    view = tensor_view(dataset)
    if view is not None:
        tensors, index = view
        for start in range(0, len(index), batch_size):
            picked = index[start:start + batch_size]
            yield tensors[0][picked], tensors[1][picked]
        return
    iterator = _start_workers(DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
        collate_fn=_collate, worker_init_fn=_ignore_stop_signals if num_workers else None))
    try:
        yield from iterator
    finally:
        shutdown_workers(iterator)


@torch.no_grad()
def accuracy(algorithm, dataset: Dataset, device, batch_size: int = 64, num_workers: int = 0,
             subsets: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Top-1 accuracy of ``algorithm.predict`` on ``dataset`` (``misc.accuracy``), in eval mode, restoring
    train mode after. ``subsets`` maps a name to a boolean mask over the dataset's items; each named
    subset's accuracy is returned too (NaN when it is empty). Key ``""`` is the whole dataset."""
    algorithm.eval()
    hits = []
    try:
        with contextlib.closing(eval_batches(dataset, batch_size, num_workers)) as batches:
            for x, y in batches:
                logits = algorithm.predict(x.to(device))
                if logits.dim() != 2 or logits.size(1) < 2:
                    raise ValueError(f"predict() must return [N, num_classes>=2] logits, got "
                                     f"shape {tuple(logits.shape)}")
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
