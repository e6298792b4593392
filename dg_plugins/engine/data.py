"""Data for the train loop: the in/out split of an environment, training batch streams, evaluation
batches and accuracy (``domainbed/lib/misc.py``, ``domainbed/lib/fast_data_loader.py``). Which
splits a job makes and evaluates is :class:`dg_plugins.engine.splits.Splits`.

Differences from DomainBed, by design:
* Training batches (``batch_sampling`` "per_domain", DomainBed's) are drawn i.i.d. with
  replacement from each environment's in-split (DomainBed's sampler also draws with
  replacement), one ``randint`` per batch from a per-stream generator. A batch larger than the
  split therefore just repeats samples; DomainBed hangs forever there. ``batch_sampling``
  "pooled" is the DMG release's loader (:class:`PooledBatches`).
* Every batch is a deterministic function of (stream seed, batch index): its indices come from
  the stream's sampler, and every random draw of its items' ``__getitem__`` (the augmentations)
  is made under ``seed_hash(stream seed, batch index)`` in a forked RNG scope
  (:func:`seeded_rng`), whichever process makes it, with or without loader workers; the main
  process's RNG is untouched. So a resumed job draws exactly the batches an uninterrupted job
  would, and ``n_workers`` does not change a run's numbers. Evaluation batches are seeded the same
  way by (split seed, batch index) (:func:`eval_batches`), so re-evaluating a saved model
  reproduces its record.
* In-memory tensor datasets are gathered in-process by tensor indexing (no worker processes).
  For other datasets one pool of at most ``min(N_WORKERS, cpus)`` workers serves all the
  training streams of a job (:func:`share_workers`), and the train job ends it before it
  evaluates (evaluation loaders get the same budget), so a job's live loader workers never exceed
  its budget.

Loader workers (the lifecycle): workers ignore SIGTERM/SIGINT, so that a signal sent to the job's
whole process group (Ctrl-C, a sweep forwarding Slurm's SIGTERM, Slurm signalling every process)
reaches only the train process, which stops at a step boundary with a checkpoint. Because they
ignore SIGTERM, multiprocessing's exit handler (terminate, then join) cannot end them, so the
owner must: :meth:`Stream.close` (:meth:`WorkerPool.close`) and the evaluation iterator of
:func:`eval_batches` shut their workers down through the loader's own protocol (done event, then
join), and kill any that did not exit. The train job closes its streams on every exit path; as a
last resort, an exit handler of this module (it runs before multiprocessing's and torch's, being
registered after them) closes whatever worker loader is still open, so no process can hang at
exit or leave a worker behind.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import math
import os
import random
import weakref

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dg_plugins.seeds import seed_hash


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


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Run the block with torch's CPU generator, ``random`` and ``numpy.random`` seeded from
    ``seed``, and give the three their previous states back after it: whatever the block draws
    (random augmentations) depends on ``seed`` alone, and the caller's RNG streams are untouched.
    (Only the CPU generator: a CUDA generator is neither used by transforms nor reseeded.)"""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    try:
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)


def collate(items) -> tuple:
    """``[(x, y[, more]), ...]`` -> ``(stacked x, tensor of y[, tensor of more])``."""
    columns = list(zip(*items))
    return (torch.stack(list(columns[0])),) + tuple(torch.as_tensor(c) for c in columns[1:])


def fetch(dataset: Dataset, indices, seed: int) -> tuple:
    """The batch of ``dataset``'s items ``indices``, collated, every random draw of their
    ``__getitem__`` (augmentations) made under :func:`seeded_rng` ``(seed)``: the same batch in
    any process, with or without loader workers."""
    with seeded_rng(seed):
        return collate([dataset[i] for i in indices])


def _as_is(batch):
    return batch


class _Fetcher(Dataset):
    """What a loader worker runs: a request ``[(dataset number, seed, indices), ...]`` (one
    entry per stream of a step, or one evaluation batch) -> the batches, each made by
    :func:`fetch` (the DataLoader calls ``__getitems__`` with what the batch sampler yields)."""

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)

    def __getitems__(self, request):
        return [fetch(self.datasets[j], indices, seed) for j, seed, indices in request]

    def __getitem__(self, index):
        raise TypeError("_Fetcher is read by batch requests only")


def _worker_loader(datasets, requests, num_workers: int):
    """A started worker iterator serving ``requests`` (an iterable of :class:`_Fetcher`
    requests). Its private ``generator`` keeps the loader from drawing its base seed from the
    main process's torch RNG (which would make a run's randomness depend on when loaders start,
    e.g. after a resume)."""
    return _start_workers(DataLoader(
        _Fetcher(datasets), batch_sampler=requests, num_workers=num_workers, collate_fn=_as_is,
        prefetch_factor=2, worker_init_fn=_ignore_stop_signals, generator=torch.Generator()))


class _Requests:
    """The batch sampler of a :class:`WorkerPool`'s loader: one request per round (a step)."""

    def __init__(self, pool: "WorkerPool"):
        self.pool = pool

    def __iter__(self):
        streams = self.pool.streams
        while True:
            yield [(j, *stream.draw()) for j, stream in enumerate(streams)]


class WorkerPool:
    """One set of loader workers making the batches of several training streams: each request
    is one round, the next batch of every stream (a training step draws one batch of each, so
    the streams are consumed in lockstep; a stream drawn a round ahead of another raises). Workers
    prefetch rounds ahead; :meth:`close` ends them and puts every stream back at the batches it
    handed out, so the next batch starts new workers exactly where the stream stood."""

    def __init__(self, streams, num_workers: int):
        if num_workers < 1:
            raise ValueError(f"a worker pool needs num_workers >= 1, got {num_workers}")
        self.streams = list(streams)
        self.num_workers = num_workers
        self.iterator = None
        self.buffers = {id(s): collections.deque() for s in self.streams}

    def take(self, stream) -> tuple:
        """``stream``'s next batch (fetching the next round when its buffer is empty)."""
        buffer = self.buffers[id(stream)]
        if not buffer:
            if self.iterator is None:
                self.iterator = _worker_loader([s.dataset for s in self.streams],
                                               _Requests(self), self.num_workers)
            for s, batch in zip(self.streams, next(self.iterator)):
                self.buffers[id(s)].append(batch)
            if any(len(b) > 1 for b in self.buffers.values()):
                raise RuntimeError("streams that share loader workers must each be drawn once "
                                   "per step (one batch of every stream per round)")
        return buffer.popleft()

    @property
    def workers(self) -> list:
        """The live worker processes (none before the first batch or after :meth:`close`)."""
        return list(getattr(self.iterator, "_workers", None) or [])

    def close(self) -> None:
        """End the workers; every stream continues from the batches it handed out."""
        iterator, self.iterator = self.iterator, None
        if iterator is not None:
            shutdown_workers(iterator)
        for stream in self.streams:
            self.buffers[id(stream)].clear()
            stream.rewind(stream.consumed)


def share_workers(streams, num_workers: int) -> WorkerPool | None:
    """Make one :class:`WorkerPool` of ``num_workers`` workers serve every stream of
    ``streams`` that reads items (streams over in-memory tensors gather in-process); ``0``: all
    of them fetch in-process. A job's live training workers are then at most its budget."""
    streams = list(streams)
    for stream in streams:
        if stream.pool is not None:
            stream.pool.close()
    fetching = [s for s in streams if s.view is None]
    pool = WorkerPool(fetching, num_workers) if fetching and num_workers > 0 else None
    for stream in streams:
        stream.pool = pool if stream in fetching else None
        stream.num_workers = num_workers if stream.pool is not None else 0
    return pool


class Stream:
    """Endless training batches: batch ``k`` holds the items a subclass's sampler draws for it
    (``next_indices``, a pure function of the stream's seed and the batches drawn before it, and
    ``rewind(n)`` to stand before batch ``n``), and every random draw of those items'
    ``__getitem__`` (augmentations) is made under ``seed_hash(seed, k)`` (:func:`fetch`), in
    whichever process makes it. So the stream's state is (seed, batches handed out), and a
    stream restored from it hands out exactly the batches an uninterrupted one does, with or
    without loader workers (``num_workers``: the workers of this stream's own pool, started at
    the first batch; :func:`share_workers` gives several streams one pool)."""

    view = None

    def __init__(self, dataset: Dataset, seed: int, num_workers: int = 0):
        self.dataset = dataset
        self.seed = seed
        self.num_workers = num_workers
        self.pool: WorkerPool | None = None
        self.consumed = 0
        self.rewind(0)

    # the sampler (subclasses)
    def next_indices(self) -> torch.Tensor:
        raise NotImplementedError

    def rewind(self, n: int) -> None:
        raise NotImplementedError

    def gather(self, indices: torch.Tensor):
        """The batch of ``indices`` from the in-memory tensors (streams with a ``view``)."""
        raise NotImplementedError

    def finish(self, batch: tuple):
        """What ``next`` returns for a fetched (collated) batch."""
        return batch

    def draw(self) -> tuple[int, list]:
        """``(seed of the next batch, its indices)``; advances the sampler."""
        k = self.drawn
        indices = self.next_indices()
        return seed_hash(self.seed, k), indices.tolist()

    def __next__(self):
        if self.view is not None:
            value = self.gather(self.next_indices())
        else:
            if self.pool is None and self.num_workers > 0:
                self.pool = WorkerPool([self], self.num_workers)
            if self.pool is not None:
                batch = self.pool.take(self)
            else:
                seed, indices = self.draw()
                batch = fetch(self.dataset, indices, seed)
            value = self.finish(batch)
        self.consumed += 1
        return value

    def __iter__(self):
        return self

    def state_dict(self) -> dict:
        return {"seed": self.seed, "drawn": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        if self.pool is not None:
            self.pool.close()
        self.seed = state["seed"]
        self.consumed = state["drawn"]
        self.rewind(self.consumed)

    def close(self) -> None:
        """End the loader workers making this stream's batches, if any (of its pool: every
        stream of the pool stops prefetching). The stream stays usable at its position; its next
        batch starts new workers."""
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BatchStream(Stream):
    """Endless i.i.d. training batches of one environment split: ``batch_size`` indices drawn
    with replacement (optionally class-weighted) by one ``torch.Generator`` seeded with ``seed``
    (DomainBed's ``InfiniteDataLoader`` also samples with replacement); ``rewind`` replays the
    draws."""

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


class _Union(Dataset):
    """The items of several splits one after the other, each as ``(x, y, split number)``."""

    def __init__(self, splits):
        self.splits = list(splits)
        self.offsets = np.cumsum([0] + [len(s) for s in self.splits]).tolist()

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index):
        part = bisect.bisect_right(self.offsets, index) - 1
        x, y = self.splits[part][index - self.offsets[part]][:2]
        return x, y, part


class PooledBatches(Stream):
    """The DMG release's batches (``batch_sampling`` "pooled"): its training loader is a
    ``DataLoader(ConcatDataset(source domains), batch_size=64, shuffle=True)`` with the default
    ``drop_last=False`` (``dataloaders/domain_datasets.py`` lines 134 and 159-164 of
    github.com/prithv1/DMG at 6b162b4), so every epoch is one random permutation of the union of
    the source splits cut into ``ceil(N / batch_size)`` batches, the last one holding the
    remaining ``N mod batch_size`` items, and each domain's share of a batch follows its size.

    Here epoch ``e``'s permutation is drawn from ``seed_hash(seed, "epoch", e)``, so batch ``k``
    is a pure function of (seed, k). ``next`` returns the algorithm's minibatches: one
    ``(x, y)`` per split, in split order, holding that split's items of the batch in batch order
    (0 rows when it has none)."""

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

    def part_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The split number of each union index."""
        return torch.searchsorted(self.offsets, indices, right=True) - 1

    def gather(self, indices):
        part = self.part_of(indices)
        out = []
        for i, (tensors, index) in enumerate(self.view):
            local = indices[part == i] - self.offsets[i]
            picked = index[local]
            out.append((tensors[0][picked], tensors[1][picked]))
        return out

    def finish(self, batch):
        x, y, part = batch
        return [(x[part == i], y[part == i]) for i in range(len(self.splits))]


def eval_batches_of(datasets, batch_size: int, num_workers: int):
    """The evaluation batches of several datasets, one after the other, as ``(dataset number,
    x, y)``: ``datasets`` is ``[(dataset, seed), ...]``, and batch ``k`` of a dataset has its
    random draws (an augmented split's transforms) made under ``seed_hash(seed, k)``
    (:func:`fetch`), so an evaluation gives the same batches whichever process makes them and
    however often it is repeated. In-memory tensor datasets are gathered in-process; the others
    are made by one loader of ``num_workers`` workers for all of them (one start per evaluation,
    not one per split). Close the generator when stopping early (``contextlib.closing``): the
    workers are shut down then, not at garbage collection."""
    plan = []  # (dataset number, tensor view or None, [(seed, indices) per batch])
    for j, (dataset, seed) in enumerate(datasets):
        starts = range(0, len(dataset), batch_size)
        plan.append((j, tensor_view(dataset),
                     [(seed_hash(seed, k), list(range(start, min(start + batch_size,
                                                                  len(dataset)))))
                      for k, start in enumerate(starts)]))
    requests = [[(j, seed, indices)] for j, view, batches in plan if view is None
                for seed, indices in batches]
    iterator = None
    if requests and num_workers > 0:
        iterator = _worker_loader([dataset for dataset, _ in datasets], requests, num_workers)
    try:
        for j, view, batches in plan:
            dataset = datasets[j][0]
            for seed, indices in batches:
                if view is not None:
                    tensors, index = view
                    picked = index[indices[0]:indices[-1] + 1]
                    x, y = tensors[0][picked], tensors[1][picked]
                elif iterator is not None:
                    (x, y), = next(iterator)
                else:
                    x, y = fetch(dataset, indices, seed)
                yield j, x, y
    finally:
        if iterator is not None:
            shutdown_workers(iterator)


def eval_batches(dataset: Dataset, batch_size: int, num_workers: int, seed: int = 0):
    """The evaluation batches ``(x, y)`` of ``dataset`` in order (:func:`eval_batches_of`, whose
    closing rule applies)."""
    with contextlib.closing(eval_batches_of([(dataset, seed)], batch_size, num_workers)) as each:
        for _, x, y in each:
            yield x, y


@torch.no_grad()
def accuracies(algorithm, datasets, device, batch_size: int = 64,
               num_workers: int = 0) -> list[dict[str, float]]:
    """Top-1 accuracy of ``algorithm.predict`` (``misc.accuracy``) on each of ``datasets``
    (``[(dataset, seed, subsets), ...]``, their batches from :func:`eval_batches_of`: one worker
    loader for all), in eval mode, restoring train mode after. ``subsets`` (or None) maps a name
    to a boolean mask over the dataset's items; each named subset's accuracy is returned too (NaN
    when it is empty). Key ``""`` is the whole dataset."""
    algorithm.eval()
    hits = [[] for _ in datasets]
    try:
        with contextlib.closing(eval_batches_of([(d, seed) for d, seed, _ in datasets],
                                                batch_size, num_workers)) as batches:
            for j, x, y in batches:
                logits = algorithm.predict(x.to(device))
                if logits.dim() != 2 or logits.size(1) < 2:
                    raise ValueError(f"predict() must return [N, num_classes>=2] logits, got "
                                     f"shape {tuple(logits.shape)}")
                hits[j].append((logits.argmax(1) == y.to(device)).cpu())
    finally:
        algorithm.train()
    out = []
    for found, (_, _, subsets) in zip(hits, datasets):
        correct = torch.cat(found).double() if found else torch.zeros(0, dtype=torch.double)
        accs = {"": correct.mean().item() if len(correct) else float("nan")}
        for name, mask in (subsets or {}).items():
            picked = correct[torch.as_tensor(mask, dtype=torch.bool)]
            accs[name] = picked.mean().item() if len(picked) else float("nan")
        out.append(accs)
    return out


def accuracy(algorithm, dataset: Dataset, device, batch_size: int = 64, num_workers: int = 0,
             subsets: dict[str, torch.Tensor] | None = None, seed: int = 0) -> dict[str, float]:
    """:func:`accuracies` of one dataset (``seed``: its batches' augmentation seed)."""
    return accuracies(algorithm, [(dataset, seed, subsets)], device, batch_size, num_workers)[0]


def class_balanced_weights(dataset: Dataset) -> torch.Tensor:
    """Per-sample weights ``1 / (count[c] * n_classes_present)`` (``misc.make_weights_for_balanced_classes``), summing to 1."""
    view = tensor_view(dataset)
    labels = (view[0][1][view[1]] if view is not None
              else torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))]))
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (counts[inverse].double() * len(classes))
