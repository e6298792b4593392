"""A job's training batches (``fast_data_loader.py``'s role), per environment or pooled, each a
pure function of (seed, batch index) so that a resumed job and any number of workers draw the same;
and the job's one pool of loader workers."""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import math
import signal
import weakref

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, default_collate

from dg_plugins.runtime import job_cores
from dg_plugins.seeds import seed_hash, seeded_rng
from dg_plugins.train.splits import finisher as finisher_of, tensor_view


def cuda_transfers(device) -> bool:
    """Whether batches for ``device`` go through pinned memory and non-blocking copies (CUDA)."""
    return getattr(device, "type", str(device).split(":")[0]) == "cuda"


def worker_budget(n_workers: int | None = None) -> tuple[int, str]:
    """A job's loader workers and why: ``--n_workers`` when given, else one per core it has."""
    if n_workers is not None:
        if n_workers < 0:
            raise ValueError(f"--n_workers must be >= 0, got {n_workers} (0: load in the "
                             "training process; leave it out for one worker per core)")
        return n_workers, "--n_workers"
    cores, source = job_cores()
    return cores, f"one per core: {cores} core{'s' * (cores != 1)}, {source}"


def _ignore_stop_signals(worker_id: int) -> None:
    """Ignore the group's SIGTERM/SIGINT: train stops at a step boundary, then ends us."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


#: Worker iterators not yet shut down (ended by :func:`shutdown_workers`, or at exit).
_OPEN_WORKER_ITERATORS: "weakref.WeakSet" = weakref.WeakSet()


def shutdown_workers(iterator, timeout: float = 5.0) -> None:
    """End a DataLoader iterator's workers; SIGKILL for those still alive (they ignore SIGTERM)."""
    _OPEN_WORKER_ITERATORS.discard(iterator)
    workers = list(getattr(iterator, "_workers", None) or [])
    with contextlib.suppress(Exception):
        iterator._shutdown_workers()
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(timeout)


@atexit.register
def _shutdown_open_workers() -> None:
    for iterator in list(_OPEN_WORKER_ITERATORS):
        shutdown_workers(iterator)


def fetch(dataset: Dataset, indices, seed: int, pixels: bool = False) -> tuple:
    """The batch ``(x, y[, ...])`` of ``indices``, its random draws under ``seeded_rng(seed)``, x
    by ``default_collate`` (in a worker: into shared memory); ``pixels``: the uint8
    ``dataset.pixels(i)`` that :func:`as_model_input` finishes."""
    with seeded_rng(seed):
        columns = list(zip(*[dataset.pixels(i) if pixels else dataset[i] for i in indices]))
        return (default_collate(list(columns[0])),) + tuple(torch.as_tensor(c) for c in columns[1:])


def as_model_input(batch: tuple, finisher, device, seed: int | None = None) -> tuple:
    """``batch`` with its uint8 pixels finished into the model's input (``seed``: the batch's)."""
    return batch if finisher is None else (finisher(batch[0], device, seed),) + tuple(batch[1:])


class _Fetcher(Dataset):
    """What a worker runs: a request ``[(dataset number, seed, indices, pixels), ...]`` -> the
    batches, each made by :func:`fetch` (the loader passes the batch sampler's requests)."""

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __getitems__(self, request):
        return [fetch(self.datasets[j], indices, seed, *pixels)
                for j, seed, indices, *pixels in request]


def worker_loader(datasets, requests, num_workers: int, pin_memory: bool = False):
    """A started worker iterator serving ``requests``; its own ``generator`` keeps it from drawing
    from the main torch RNG (a run's randomness would depend on when loaders start)."""
    iterator = iter(DataLoader(_Fetcher(datasets), batch_sampler=requests, num_workers=num_workers,
                               collate_fn=list, prefetch_factor=2, pin_memory=pin_memory,
                               worker_init_fn=_ignore_stop_signals, generator=torch.Generator()))
    if getattr(iterator, "_workers", None):
        _OPEN_WORKER_ITERATORS.add(iterator)
    return iterator


#: What a :class:`WorkerPool` request is: a training round, an evaluation batch, or nothing.
_ROUND, _SERVED, _IDLE = "round", "served", "idle"


def _requests(pool: "WorkerPool"):
    """The pool's endless batch sampler: a pending :meth:`WorkerPool.serve` request, else the
    next round while under the limit, else an empty request (the workers stay, idle)."""
    while True:
        if pool.pending:
            kind, request = _SERVED, pool.pending.popleft()
        elif pool.limit is None or min(s.drawn for s in pool.streams) < pool.limit:
            kind, request = _ROUND, [(j, *stream.draw(), stream.finisher is not None)
                                     for j, stream in enumerate(pool.streams)]
        else:
            kind, request = _IDLE, []
        pool.issued.append(kind)
        yield request


class WorkerPool:
    """Loader workers making rounds (the next batch of each stream, up to :attr:`limit`) and every
    evaluation's batches (:meth:`serve`); :meth:`close` rewinds each stream to where it stood."""

    def __init__(self, streams, num_workers: int, datasets=(), pin_memory: bool = False):
        if num_workers < 1:
            raise ValueError(f"a worker pool needs num_workers >= 1, got {num_workers}")
        self.streams, self.num_workers, self.pin_memory = list(streams), num_workers, pin_memory
        self.datasets = [s.dataset for s in self.streams] + list(datasets)
        self._number = {id(d): j for j, d in enumerate(self.datasets)}
        #: Batches each stream hands out in all (a job's steps): no round is fetched beyond.
        self.limit: int | None = None
        self.iterator = None  # the started worker loader
        self.buffers = {s: collections.deque() for s in self.streams}  # received, not taken
        self.pending: collections.deque = collections.deque()  # serve() requests not yet sent
        self.issued: collections.deque = collections.deque()  # kinds of the requests in flight

    def _start(self) -> None:
        if self.iterator is None:
            self.iterator = worker_loader(self.datasets, _requests(self), self.num_workers,
                                          self.pin_memory)

    def _receive(self) -> tuple[str, list]:
        self._start()
        result = next(self.iterator)
        kind = self.issued.popleft()
        if kind == _ROUND:
            for s, batch in zip(self.streams, result):
                self.buffers[s].append(batch)
        return kind, result

    def take(self, stream) -> tuple:
        buffer = self.buffers[stream]
        if len(buffer) < max(map(len, self.buffers.values())):  # it took more than another
            raise RuntimeError("streams that share loader workers must each be drawn once "
                               "per step (one batch of every stream per round)")
        while not buffer:
            kind, _ = self._receive()
            if kind == _SERVED:
                raise RuntimeError("a training batch was drawn while an evaluation was served")
            if kind == _IDLE:
                raise RuntimeError(f"the streams were drawn past their {self.limit} batches "
                                   "(the worker pool's limit)")
        return buffer.popleft()

    def holds(self, dataset) -> bool:
        return id(dataset) in self._number

    def serve(self, requests):
        """The results of ``requests``, in order; closed early, it closes the pool."""
        requests = [[(self._number[id(d)], *rest) for d, *rest in request] for request in requests]
        self._start()
        self.pending.extend(requests)
        served = 0
        try:
            while served < len(requests):
                kind, result = self._receive()
                if kind == _SERVED:
                    served += 1
                    yield result
        finally:
            if served < len(requests):
                self.close()

    @property
    def workers(self) -> list:
        return list(getattr(self.iterator, "_workers", None) or [])

    def close(self) -> None:
        """End the workers; every stream continues from the batches it handed out."""
        iterator, self.iterator = self.iterator, None
        if iterator is not None:
            shutdown_workers(iterator)
        self.pending.clear()
        self.issued.clear()
        for stream in self.streams:
            self.buffers[stream].clear()
            stream.rewind(stream.consumed)


def share_workers(streams, num_workers: int, datasets=(), pin_memory: bool = False,
                  device=None) -> WorkerPool | None:
    """One :class:`WorkerPool` for the item-reading streams and evaluations (None: none)."""
    streams = list(streams)
    for stream in streams:
        stream.device = stream.device if device is None else device
        stream.close()
    fetching = [s for s in streams if s.view is None]
    pool = (WorkerPool(fetching, num_workers, datasets, pin_memory)
            if fetching and num_workers > 0 else None)
    for stream in streams:
        stream.pool = pool if stream in fetching else None
        stream.num_workers = num_workers if stream.pool is not None else 0
    return pool


class Stream:
    """Endless training batches: batch ``k`` holds the indices the subclass's sampler draws
    (``next_indices``, ``rewind(n)``), its items' draws under ``seed_hash(seed, k)``; the state
    is (seed, batches handed out), so a restored stream continues exactly."""

    view = None

    def __init__(self, dataset: Dataset, seed: int, num_workers: int = 0):
        self.dataset, self.seed, self.num_workers = dataset, seed, num_workers
        self.pool: WorkerPool | None = None
        self.finisher = finisher_of(dataset) if self.view is None else None
        self.device, self.consumed = "cpu", 0
        self.rewind(0)

    def finish(self, batch: tuple):
        return batch

    def draw(self) -> tuple[int, list]:
        """``(seed of the next batch, its indices)``; advances the sampler."""
        return seed_hash(self.seed, self.drawn), self.next_indices().tolist()

    def __next__(self):
        if self.view is not None:
            value = self.gather(self.next_indices())
        else:
            seed = seed_hash(self.seed, self.consumed)  # batch k's: what its worker ran under
            if self.pool is None and self.num_workers > 0:
                self.pool = WorkerPool([self], self.num_workers)
            if self.pool is not None:
                batch = self.pool.take(self)
            else:
                seed, indices = self.draw()
                batch = fetch(self.dataset, indices, seed, self.finisher is not None)
            value = self.finish(as_model_input(batch, self.finisher, self.device, seed))
        self.consumed += 1
        return value

    def __iter__(self):
        return self

    def state_dict(self) -> dict:
        return {"seed": self.seed, "drawn": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.seed, self.consumed = state["seed"], state["drawn"]
        self.rewind(self.consumed)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class BatchStream(Stream):
    """i.i.d. batches drawn with replacement (as ``InfiniteDataLoader``), replayable."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, weights=None,
                 num_workers: int = 0):
        if len(dataset) == 0:
            raise ValueError("cannot train on an empty environment split")
        self.batch_size = batch_size
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.double)
        self.view = tensor_view(dataset)
        super().__init__(dataset, seed, num_workers)

    def rewind(self, n: int) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)
        self.drawn = 0
        for _ in range(n):
            self.next_indices()

    def next_indices(self) -> torch.Tensor:
        self.drawn += 1
        if self.weights is not None:
            return torch.multinomial(self.weights, self.batch_size, replacement=True,
                                     generator=self.generator)
        return torch.randint(len(self.dataset), (self.batch_size,), generator=self.generator)

    def gather(self, indices):
        tensors, index = self.view
        picked = index[indices]
        return tensors[0][picked], tensors[1][picked]


class _Union(ConcatDataset):
    """The items of several splits one after the other, each as ``(x, y, split number)``."""

    def _item(self, index, read):
        part = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[part - 1] if part else 0
        x, y = read(self.datasets[part], index - start)[:2]
        return x, y, part

    def __getitem__(self, index):
        return self._item(index, lambda split, i: split[i])

    def pixels(self, index):
        return self._item(index, lambda split, i: split.pixels(i))

    def finisher(self):
        """The splits' shared finisher (None when one has none or they differ; a device
        augmentation beside another finisher raises: a pooled batch is finished at once)."""
        finishers = [finisher_of(split) for split in self.datasets]
        if any(f is None for f in finishers):
            return None
        if any(f.key != finishers[0].key for f in finishers[1:]):
            if any(f.seeded for f in finishers):
                raise ValueError("--augment_on device: pooled batches would mix items augmented "
                                 "on the device and others; use --augment_on loader")
            return None
        return finishers[0]


class PooledBatches(Stream):
    """The DMG release's batches (``batch_sampling`` "pooled"; ``domain_datasets.py`` lines 134,
    159-164 of github.com/prithv1/DMG at 6b162b4): each epoch a permutation of the sources' union
    (from ``seed_hash(seed, "epoch", e)``) cut into ``ceil(N / batch_size)`` batches. ``next``
    returns one ``(x, y)`` per split (0 rows when it has none)."""

    def __init__(self, splits, batch_size: int, seed: int, num_workers: int = 0):
        self.splits = list(splits)
        self.sizes = [len(s) for s in self.splits]
        total = sum(self.sizes)
        if total == 0:
            raise ValueError("cannot train on empty environment splits")
        self.batch_size = batch_size
        self.batches_per_epoch = math.ceil(total / batch_size)
        self.offsets = torch.as_tensor(np.cumsum([0] + self.sizes))
        views = [tensor_view(s) for s in self.splits]
        self.view = views if all(v is not None for v in views) else None
        self._epoch, self._order = None, None
        super().__init__(_Union(self.splits), seed, num_workers)

    def rewind(self, n: int) -> None:
        self.drawn = n

    def next_indices(self) -> torch.Tensor:
        epoch, position = divmod(self.drawn, self.batches_per_epoch)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(seed_hash(self.seed, "epoch", epoch))
            self._epoch = epoch
            self._order = torch.randperm(int(self.offsets[-1]), generator=generator)
        self.drawn += 1
        return self._order[position * self.batch_size:(position + 1) * self.batch_size]

    def gather(self, indices):
        part = torch.searchsorted(self.offsets, indices, right=True) - 1
        picked = [index[indices[part == i] - self.offsets[i]]
                  for i, (_, index) in enumerate(self.view)]
        return [(tensors[0][p], tensors[1][p]) for (tensors, _), p in zip(self.view, picked)]

    def finish(self, batch):
        x, y, part = batch
        return [(x[part == i], y[part == i]) for i in range(len(self.splits))]
