"""A job's evaluation (``misc.accuracy``): its splits and test environments' IP/OOP subsets, in
batches seeded by (split, batch index) so that re-evaluating a saved model reproduces its record;
images from the decoded-image cache or the job's worker pool. Shared with alignment_eval."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch.utils.data import Dataset

from dg_plugins.seeds import seed_hash
from dg_plugins.job.flags import EVAL_DEFAULTS
from dg_plugins.train.batches import (as_model_input, cuda_transfers, fetch, shutdown_workers,
                                      worker_loader)
from dg_plugins.train.compute import DEFAULT_COMPUTE, Compute
from dg_plugins.train.splits import Splits, env_indices, finisher, tensor_view, unwrap

#: DomainBed's evaluation batch, the default of ``--eval_batch_size``.
EVAL_BATCH_SIZE = EVAL_DEFAULTS["eval_batch_size"]
#: Images read from the cache and made the model's input at once (whole evaluation batches).
CHUNK_IMAGES = 256


class _Plan:
    """How one dataset is read: its batches ``[(seed, start, stop)]`` from tensors (``view``), the
    cache (``entry``, ``rows``, ``labels``), or fetched (kept in the cache by ``writer``)."""

    def __init__(self, j: int, dataset: Dataset, seed: int, batch_size: int):
        self.j, self.dataset = j, dataset
        n = len(dataset)
        self.batches = [(seed_hash(seed, k), start, min(start + batch_size, n))
                        for k, start in enumerate(range(0, n, batch_size))]
        self.view = tensor_view(dataset)
        self.finisher = None if self.view is not None else finisher(dataset)
        self.entry = self.rows = self.labels = self.writer = None
        if self.finisher is None or not n:
            return
        env = unwrap(dataset)[0]  # the split's pixels in its cache, else a writer to keep them
        if (store := getattr(env, "pixel_store", None)) is None:
            return
        positions = env_indices(dataset)
        transforms = [env.pixel_transform(t) for t in env.item_transforms()]
        evaluated = np.fromiter(env.eval_indices or (), dtype=np.int64)
        choice = np.isin(positions, evaluated).astype(np.uint8)  # 1: an evaluation item
        used = set(choice.tolist())
        if len(used) == 1 and transforms[used.pop()].deterministic:
            entry = store.plain_entry(transforms[int(choice[0])])
            if entry is None or not entry.covers(positions):
                return  # an item left out (unreadable?): fetched, as without the cache
            self.entry, self.rows = entry, positions
        else:
            key = store.eval_key(positions, transforms, choice, batch_size, seed)
            self.entry = store.eval_entry(key)
            if self.entry is None:
                self.writer = store.eval_writer(key, n)
                return
        self.labels = np.asarray(env.targets, dtype=np.int64)[positions]


def eval_batches_of(datasets, batch_size: int, num_workers: int, pool=None,
                    pin_memory: bool = False, device=None):
    """``(dataset number, x, y)`` of ``[(dataset, seed), ...]``, batch ``k``'s draws under
    ``seed_hash(seed, k)``, made by ``pool`` or one loader for all. Close it when stopping early."""
    device = torch.device(device or "cpu")
    plans = [_Plan(j, dataset, seed, batch_size) for j, (dataset, seed) in enumerate(datasets)]
    fetched = [(plan.j, seed, list(range(start, stop)), plan.finisher is not None)
               for plan in plans if plan.view is None and plan.entry is None
               for seed, start, stop in plan.batches]
    stop = contextlib.ExitStack()  # ends the workers and the cache writers
    if fetched and pool is not None and all(pool.holds(datasets[j][0]) for j, *_ in fetched):
        iterator = pool.serve([[(datasets[j][0], *rest)] for j, *rest in fetched])
        stop.callback(iterator.close)
    elif fetched and num_workers > 0:
        iterator = worker_loader([dataset for dataset, _ in datasets],
                                 [[request] for request in fetched], num_workers, pin_memory)
        stop.callback(shutdown_workers, iterator)
    else:  # fetched in this process, each batch when the loop asks for it
        iterator = ([fetch(datasets[j][0], indices, seed, pixels)]
                    for j, seed, indices, pixels in fetched)
    for plan in plans:
        if plan.writer is not None:
            stop.callback(plan.writer.abort)  # a no-op once committed
    with stop:
        for plan in plans:
            if plan.view is not None:
                tensors, index = plan.view
                for _, start, end in plan.batches:
                    picked = index[start:end]
                    yield plan.j, tensors[0][picked], tensors[1][picked]
            elif plan.entry is not None:
                yield from _cached_batches(plan, batch_size, device, pin_memory)
            else:
                for seed, start, end in plan.batches:
                    batch, = next(iterator)
                    if plan.writer is not None:
                        plan.writer.add(start, batch[0])
                    x, y = as_model_input(batch, plan.finisher, device, seed)[:2]
                    yield plan.j, x, y
                if plan.writer is not None:
                    plan.writer.commit()


def _cached_batches(plan: _Plan, batch_size: int, device, pin_memory: bool):
    """A split's batches from the cache, finished on the device in chunks."""
    step = batch_size * max(1, CHUNK_IMAGES // batch_size)
    n = len(plan.dataset)
    for start in range(0, n, step):
        end = min(start + step, n)
        rows = slice(start, end) if plan.rows is None else plan.rows[start:end]
        pixels = torch.from_numpy(plan.entry.read(rows))
        if pin_memory:
            pixels = pixels.pin_memory()
        if not plan.finisher.seeded:
            x = plan.finisher(pixels, device)
        y = torch.from_numpy(plan.labels[start:end])
        for first in range(0, end - start, batch_size):
            last = first + batch_size
            if plan.finisher.seeded:
                seed = plan.batches[(start + first) // batch_size][0]
                yield plan.j, plan.finisher(pixels[first:last], device, seed), y[first:last]
            else:
                yield plan.j, x[first:last], y[first:last]


def eval_batches(dataset: Dataset, batch_size: int, num_workers: int, seed: int = 0):
    with contextlib.closing(eval_batches_of([(dataset, seed)], batch_size, num_workers)) as each:
        for _, x, y in each:
            yield x, y


def accuracies(algorithm, datasets, device, batch_size: int = EVAL_BATCH_SIZE,
               num_workers: int = 0, pool=None, compute: Compute = DEFAULT_COMPUTE) -> list[dict]:
    """Top-1 accuracy on each ``(dataset, seed, subsets)``: key ``""`` the whole dataset, and each
    subset (a name -> boolean mask; NaN when empty)."""
    algorithm.eval()
    hits = [[] for _ in datasets]
    transfer = cuda_transfers(device)
    try:
        with torch.inference_mode(), contextlib.closing(eval_batches_of(
                [(d, seed) for d, seed, _ in datasets], batch_size, num_workers, pool,
                pin_memory=transfer, device=device)) as batches:
            for j, x, y in batches:
                with compute.autocast(device):
                    logits = algorithm.predict(compute.model_input(
                        x.to(device, non_blocking=transfer)))
                if logits.dim() != 2 or logits.size(1) < 2:
                    raise ValueError(f"predict() must return [N, num_classes>=2] logits, got "
                                     f"shape {tuple(logits.shape)}")
                hits[j].append((logits.argmax(1) == y.to(device, non_blocking=transfer)).cpu())
    finally:
        algorithm.train()
    out = []  # the mean of no items is NaN
    for found, (_, _, subsets) in zip(hits, datasets):
        correct = torch.cat(found).double() if found else torch.zeros(0, dtype=torch.double)
        out.append({"": correct.mean().item(), **{
            name: correct[torch.as_tensor(mask, dtype=torch.bool)].mean().item()
            for name, mask in (subsets or {}).items()}})
    return out


def accuracy(algorithm, dataset: Dataset, device, batch_size: int = EVAL_BATCH_SIZE,
             num_workers: int = 0, subsets: dict[str, torch.Tensor] | None = None,
             seed: int = 0) -> dict[str, float]:
    return accuracies(algorithm, [(dataset, seed, subsets)], device, batch_size, num_workers)[0]


def eval_seed(name: str) -> int:
    """The seed of split ``name``'s evaluation batches, the same in every job and re-evaluation."""
    return seed_hash("eval", name)


def evaluate(algorithm, splits: Splits, device, num_workers: int = 0, names=None,
             batch_size: int = EVAL_BATCH_SIZE, pool=None, compute: Compute = DEFAULT_COMPUTE):
    """A record's accuracy keys: ``env{i}_{in,out,uda}_acc`` of the splits ``names`` (None: all),
    and ``env{i}_{in,out}_{subset}_acc`` / ``_count`` of each test environment's subsets."""
    named = splits.eval_named()
    if names is not None:
        if unknown := sorted(set(names) - {name for name, _, _ in named}):
            raise ValueError(f"no split named {', '.join(unknown)} in this job")
        named = [entry for entry in named if entry[0] in set(names)]
    masks = [splits.subset_masks(split, env) for _, split, env in named]
    results = accuracies(algorithm, [(split, eval_seed(name), subsets) for (name, split, _),
                                     subsets in zip(named, masks)], device, batch_size,
                         num_workers, pool, compute)
    out = {}
    for (name, _, _), subsets, accs in zip(named, masks, results):
        out[name + "_acc"] = accs[""]
        for subset, mask in subsets.items():
            out[f"{name}_{subset}_acc"] = accs[subset]
            out[f"{name}_{subset}_count"] = int(mask.sum())
    return out
