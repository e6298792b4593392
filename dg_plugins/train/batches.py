"""The training batches of a job (``domainbed/lib/fast_data_loader.py``'s role): endless streams,
one per source environment (i.i.d. draws with replacement, DomainBed's) or pooled (the DMG
release's loader), each batch a pure function of (stream seed, batch index), so that a resumed job
and any number of loader workers draw exactly the same batches; and the loader workers' lifecycle
(one pool per job, which also makes the batches of every evaluation, :meth:`WorkerPool.serve`;
ended on every way out). See docs/domainbed_differences.md."""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import math
import weakref

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from dg_plugins.runtime import job_cores
from dg_plugins.seeds import seed_hash, seeded_rng
from dg_plugins.train.splits import finisher as finisher_of
from dg_plugins.train.splits import tensor_view


def cuda_transfers(device) -> bool:
    """Whether batches bound for ``device`` go through pinned memory and non-blocking copies
    (a CUDA device; on a CPU pinning is wasted work and raises without a GPU)."""
    return getattr(device, "type", str(device).split(":")[0]) == "cuda"


def worker_budget(n_workers: int | None = None) -> tuple[int, str]:
    """A job's loader workers and why: ``n_workers`` (``--n_workers``) when given, else one per
    core the job has (:func:`dg_plugins.runtime.job_cores`). Its one pool makes the batches of
    training and of every evaluation, so they share these workers."""
    if n_workers is not None:
        if n_workers < 0:
            raise ValueError(f"--n_workers must be >= 0, got {n_workers} (0: load in the "
                             "training process; leave it out for one worker per core)")
        return n_workers, "--n_workers"
    cores, source = job_cores()
    return cores, f"one per core: {cores} core{'s' * (cores != 1)}, {source}"


def _ignore_stop_signals(worker_id: int) -> None:
    """Loader workers ignore SIGTERM/SIGINT: a signal to the whole process group (Ctrl-C, a
    sweep forwarding Slurm's SIGTERM) must reach only the train process, which stops at a step
    boundary and then ends its workers itself."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


#: Worker iterators not yet shut down (ended by :func:`shutdown_workers`, or at exit).
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


def collate(items) -> tuple:
    """``[(x, y[, more]), ...]`` -> ``(stacked x, tensor of y[, tensor of more])``; in a loader
    worker x is stacked straight into shared memory (torch's ``default_collate``), which the
    batch is sent through, so it is not copied there again."""
    columns = list(zip(*items))
    return (default_collate(list(columns[0])),) + tuple(torch.as_tensor(c) for c in columns[1:])


def fetch(dataset: Dataset, indices, seed: int, pixels: bool = False) -> tuple:
    """The batch of ``dataset``'s items ``indices``, collated, every random draw of their
    ``__getitem__`` (augmentations) made under :func:`seeded_rng` ``(seed)``: the same batch in
    any process, with or without loader workers. ``pixels``: the items' uint8 pixels
    (``dataset.pixels(i)``, the same draws), which :func:`as_model_input` turns into the
    transform's output on the job's device."""
    with seeded_rng(seed):
        if pixels:
            return collate([dataset.pixels(i) for i in indices])
        return collate([dataset[i] for i in indices])


def as_model_input(batch: tuple, finisher, device, seed: int | None = None) -> tuple:
    """A fetched batch with its uint8 pixels (``finisher`` not None: :func:`fetch` with
    ``pixels``) turned into the model's float input on ``device`` by ``finisher``
    (:func:`dg_plugins.train.splits.finisher`; ``seed``: the batch's, which a device
    augmentation draws from); else the batch as it is."""
    if finisher is None:
        return batch
    return (finisher(batch[0], device, seed),) + tuple(batch[1:])


def _as_is(batch):
    return batch


class _Fetcher(Dataset):
    """What a loader worker runs: a request ``[(dataset number, seed, indices, pixels), ...]``
    (one entry per stream of a step, or one evaluation batch) -> the batches, each made by
    :func:`fetch` (the DataLoader calls ``__getitems__`` with what the batch sampler yields)."""

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)

    def __getitems__(self, request):
        return [fetch(self.datasets[j], indices, seed, *pixels)
                for j, seed, indices, *pixels in request]

    def __getitem__(self, index):
        raise TypeError("_Fetcher is read by batch requests only")


def worker_loader(datasets, requests, num_workers: int, pin_memory: bool = False):
    """A started worker iterator serving ``requests`` (an iterable of :class:`_Fetcher`
    requests; ``pin_memory``: batches bound for a CUDA device, :func:`cuda_transfers`). Its
    private ``generator`` keeps the loader from drawing its base seed from the main process's
    torch RNG (which would make a run's randomness depend on when loaders start, e.g. after a
    resume)."""
    return _start_workers(DataLoader(
        _Fetcher(datasets), batch_sampler=requests, num_workers=num_workers, collate_fn=_as_is,
        prefetch_factor=2, worker_init_fn=_ignore_stop_signals, generator=torch.Generator(),
        pin_memory=pin_memory))


#: What a :class:`WorkerPool` request is: a training round, an evaluation batch, or nothing.
_ROUND, _SERVED, _IDLE = "round", "served", "idle"


class _Requests:
    """The batch sampler of a :class:`WorkerPool`'s loader, asked for the next request each time
    the loader has room for one: a pending :meth:`WorkerPool.serve` request first, else the next
    training round while the streams have batches left to hand out (:attr:`WorkerPool.limit`),
    else an empty request (the loader's workers stay, idle, for the next evaluation). It never
    ends, so the loader always has requests in flight and never shuts down on its own."""

    def __init__(self, pool: "WorkerPool"):
        self.pool = pool

    def __iter__(self):
        pool = self.pool
        while True:
            if pool.pending:
                pool.issued.append(_SERVED)
                yield pool.pending.popleft()
            elif pool.limit is None or min(s.drawn for s in pool.streams) < pool.limit:
                pool.issued.append(_ROUND)
                yield [(j, *stream.draw(), stream.finisher is not None)
                       for j, stream in enumerate(pool.streams)]
            else:
                pool.issued.append(_IDLE)
                yield []


class WorkerPool:
    """One set of loader workers making the batches of several training streams, and of every
    evaluation of the job (:meth:`serve`): no worker starts per evaluation, and the job's live
    workers stay within its budget. A training request is one round, the next batch of every
    stream (a training step draws one batch of each, so the streams are consumed in lockstep; a
    stream drawn a round ahead of another raises). Workers prefetch rounds ahead, up to
    :attr:`limit` batches per stream (the job's steps; None: endless); rounds that arrive while an
    evaluation is served wait in the streams' buffers. ``datasets``: the other datasets that
    :meth:`serve` requests read (an evaluation's splits), known when the workers start.
    :meth:`close` ends the workers and puts every stream back at the batches it handed out, so
    the next batch starts new workers exactly where the stream stood."""

    def __init__(self, streams, num_workers: int, datasets=(), pin_memory: bool = False):
        if num_workers < 1:
            raise ValueError(f"a worker pool needs num_workers >= 1, got {num_workers}")
        self.streams = list(streams)
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.datasets = [s.dataset for s in self.streams] + list(datasets)
        self._number = {id(d): j for j, d in enumerate(self.datasets)}
        #: Batches each stream hands out in all (a job's steps): no round is fetched beyond.
        self.limit: int | None = None
        self.iterator = None
        self.buffers = {id(s): collections.deque() for s in self.streams}
        self.taken = {id(s): 0 for s in self.streams}
        self.pending: collections.deque = collections.deque()  # serve() requests not yet sent
        self.issued: collections.deque = collections.deque()  # kinds of the requests in flight

    def _start(self) -> None:
        if self.iterator is None:
            self.iterator = worker_loader(self.datasets, _Requests(self), self.num_workers,
                                          self.pin_memory)

    def _receive(self) -> tuple[str, list]:
        """The next result in request order, with its kind; a training round goes to the
        streams' buffers."""
        self._start()
        result = next(self.iterator)
        kind = self.issued.popleft()
        if kind == _ROUND:
            for s, batch in zip(self.streams, result):
                self.buffers[id(s)].append(batch)
        return kind, result

    def take(self, stream) -> tuple:
        """``stream``'s next batch (fetching rounds until its buffer has one)."""
        key = id(stream)
        if self.taken[key] > min(self.taken.values()):
            raise RuntimeError("streams that share loader workers must each be drawn once "
                               "per step (one batch of every stream per round)")
        buffer = self.buffers[key]
        while not buffer:
            kind, _ = self._receive()
            if kind == _SERVED:
                raise RuntimeError("a training batch was drawn while an evaluation was served")
            if kind == _IDLE:
                raise RuntimeError(f"the streams were drawn past their {self.limit} batches "
                                   "(the worker pool's limit)")
        self.taken[key] += 1
        return buffer.popleft()

    def holds(self, dataset) -> bool:
        """Whether :meth:`serve` requests may read ``dataset``."""
        return id(dataset) in self._number

    def serve(self, requests):
        """The results of ``requests``, in order, made by this pool's workers (started if
        needed): each request is ``[(dataset, seed, indices), ...]`` with datasets the pool
        :meth:`holds`, optionally a fourth item ``pixels`` (:func:`fetch`); :class:`_Fetcher`
        requests by dataset instead of number. Training rounds
        in flight when it starts arrive first and stay buffered for the streams. Close the
        generator when stopping early: the pool is then closed (its workers would still make the
        abandoned requests)."""
        requests = [[(self._number[id(d)], *rest) for d, *rest in request]
                    for request in requests]
        if not requests:
            return
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
        """The live worker processes (none before the first batch or after :meth:`close`)."""
        return list(getattr(self.iterator, "_workers", None) or [])

    def close(self) -> None:
        """End the workers; every stream continues from the batches it handed out."""
        iterator, self.iterator = self.iterator, None
        if iterator is not None:
            shutdown_workers(iterator)
        self.pending.clear()
        self.issued.clear()
        for stream in self.streams:
            self.buffers[id(stream)].clear()
            self.taken[id(stream)] = 0
            stream.rewind(stream.consumed)


def share_workers(streams, num_workers: int, datasets=(), pin_memory: bool = False,
                  device=None) -> WorkerPool | None:
    """Make one :class:`WorkerPool` of ``num_workers`` workers serve every stream of
    ``streams`` that reads items (streams over in-memory tensors gather in-process), and the
    evaluations that read ``datasets`` (:meth:`WorkerPool.serve`); ``0``: all of them fetch
    in-process. A job's live workers are then at most its budget. ``pin_memory``: batches bound
    for a CUDA device (:func:`cuda_transfers`); ``device``: where streams of uint8 pixels turn
    them into the model's input (:func:`as_model_input`; default the CPU). None when no stream
    reads items."""
    streams = list(streams)
    if device is not None:
        for stream in streams:
            stream.device = device
    for stream in streams:
        if stream.pool is not None:
            stream.pool.close()
    fetching = [s for s in streams if s.view is None]
    pool = (WorkerPool(fetching, num_workers, datasets, pin_memory)
            if fetching and num_workers > 0 else None)
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
    the first batch; :func:`share_workers` gives several streams one pool). Items that have
    uint8 pixels (a :func:`~dg_plugins.train.splits.finisher`) are fetched as such and turned
    into the model's input on ``device`` (:func:`as_model_input`; a device augmentation draws
    from the batch's seed ``seed_hash(seed, k)`` too, a pooled batch's whole batch at once)."""

    view = None

    def __init__(self, dataset: Dataset, seed: int, num_workers: int = 0):
        self.dataset = dataset
        self.seed = seed
        self.num_workers = num_workers
        self.pool: WorkerPool | None = None
        self.finisher = finisher_of(dataset) if self.view is None else None
        self.device = "cpu"
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

    def pixels(self, index):
        part = bisect.bisect_right(self.offsets, index) - 1
        x, y = self.splits[part].pixels(index - self.offsets[part])[:2]
        return x, y, part

    def finisher(self):
        """The splits' shared finisher (None when one has none or they differ; a device
        augmentation beside another finisher raises: a pooled batch is finished at once)."""
        finishers = [finisher_of(split) for split in self.splits]
        if any(f is None for f in finishers):
            return None
        if any(f.key != finishers[0].key for f in finishers[1:]):
            if any(f.seeded for f in finishers):
                raise ValueError("--augment_on device: pooled batches would mix items augmented "
                                 "on the device and others; use --augment_on loader")
            return None
        return finishers[0]


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
