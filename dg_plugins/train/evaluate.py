"""What a job evaluates and how (``domainbed/lib/misc.py``'s ``accuracy``): every split named as
DomainBed's train.py names it (or, with ``--eval_splits selection``, those model selection reads:
:func:`dg_plugins.train.folder.evaluated_splits`), and the named subsets of test environments
(IP/OOP), in batches of ``--eval_batch_size`` (DomainBed's 64) seeded by (split, batch index), so
that re-evaluating a saved model reproduces its record, whichever splits are evaluated beside.
The job's one worker pool makes the batches of every evaluation (no worker start per
evaluation); the forward runs under ``torch.inference_mode``, from pinned memory with
non-blocking copies on CUDA. Shared by the job and alignment_eval."""

from __future__ import annotations

import contextlib

import torch
from torch.utils.data import Dataset

from dg_plugins.seeds import seed_hash
from dg_plugins.train import precision
from dg_plugins.train.batches import cuda_transfers, fetch, shutdown_workers, worker_loader
from dg_plugins.train.flags import EVAL_DEFAULTS
from dg_plugins.train.splits import Splits, tensor_view

#: DomainBed's evaluation batch (``domainbed/scripts/train.py``'s ``FastDataLoader``), the
#: default of ``--eval_batch_size`` (:data:`dg_plugins.train.flags.EVAL_DEFAULTS`).
EVAL_BATCH_SIZE = EVAL_DEFAULTS["eval_batch_size"]


def eval_batches_of(datasets, batch_size: int, num_workers: int, pool=None,
                    pin_memory: bool = False):
    """The evaluation batches of several datasets, one after the other, as ``(dataset number,
    x, y)``: ``datasets`` is ``[(dataset, seed), ...]``, and batch ``k`` of a dataset has its
    random draws (an augmented split's transforms) made under ``seed_hash(seed, k)``
    (:func:`fetch`), so an evaluation gives the same batches whichever process makes them and
    however often it is repeated. In-memory tensor datasets are gathered in-process; the others
    are made by the workers of ``pool`` (the job's :class:`~dg_plugins.train.batches.WorkerPool`,
    when it holds them: no worker starts), else by one loader of ``num_workers`` workers for all
    of them (one start per call, not one per split; ``pin_memory`` for a CUDA device). Close the
    generator when stopping early (``contextlib.closing``): the workers are shut down then, not
    at garbage collection."""
    plan = []  # (dataset number, tensor view or None, [(seed, indices) per batch])
    for j, (dataset, seed) in enumerate(datasets):
        starts = range(0, len(dataset), batch_size)
        plan.append((j, tensor_view(dataset),
                     [(seed_hash(seed, k), list(range(start, min(start + batch_size,
                                                                  len(dataset)))))
                      for k, start in enumerate(starts)]))
    fetched = [(j, seed, indices) for j, view, batches in plan if view is None
               for seed, indices in batches]
    iterator, stop = None, None
    if fetched and pool is not None and all(pool.holds(datasets[j][0]) for j, _, _ in fetched):
        iterator = pool.serve([[(datasets[j][0], seed, indices)] for j, seed, indices in fetched])
        stop = iterator.close
    elif fetched and num_workers > 0:
        iterator = worker_loader([dataset for dataset, _ in datasets],
                                 [[request] for request in fetched], num_workers, pin_memory)
        stop = lambda: shutdown_workers(iterator)  # noqa: E731
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
        if stop is not None:
            stop()


def eval_batches(dataset: Dataset, batch_size: int, num_workers: int, seed: int = 0):
    """The evaluation batches ``(x, y)`` of ``dataset`` in order (:func:`eval_batches_of`, whose
    closing rule applies)."""
    with contextlib.closing(eval_batches_of([(dataset, seed)], batch_size, num_workers)) as each:
        for _, x, y in each:
            yield x, y


def predict(algorithm, x: torch.Tensor, device) -> torch.Tensor:
    """The forward of one evaluation batch: ``algorithm.predict`` of ``x`` on ``device`` (a
    non-blocking copy from pinned memory on CUDA) under the job's precision, checked to be ``[N, num_classes >= 2]``
    logits. The one place an evaluation calls the model."""
    with precision.autocast(device):  # the job's --precision, --channels_last
        logits = algorithm.predict(precision.model_input(
            x.to(device, non_blocking=cuda_transfers(device))))
    if logits.dim() != 2 or logits.size(1) < 2:
        raise ValueError(f"predict() must return [N, num_classes>=2] logits, got "
                         f"shape {tuple(logits.shape)}")
    return logits


def accuracies(algorithm, datasets, device, batch_size: int = EVAL_BATCH_SIZE,
               num_workers: int = 0, pool=None) -> list[dict[str, float]]:
    """Top-1 accuracy of ``algorithm.predict`` (``misc.accuracy``) on each of ``datasets``
    (``[(dataset, seed, subsets), ...]``, their batches from :func:`eval_batches_of`: the job's
    ``pool``, or one worker loader for all), in eval mode under ``torch.inference_mode``,
    restoring train mode after. ``subsets`` (or None) maps a name to a boolean mask over the
    dataset's items; each named subset's accuracy is returned too (NaN when it is empty). Key
    ``""`` is the whole dataset."""
    algorithm.eval()
    hits = [[] for _ in datasets]
    transfer = cuda_transfers(device)
    try:
        with torch.inference_mode(), contextlib.closing(eval_batches_of(
                [(d, seed) for d, seed, _ in datasets], batch_size, num_workers, pool,
                pin_memory=transfer)) as batches:
            for j, x, y in batches:
                logits = predict(algorithm, x, device)
                hits[j].append((logits.argmax(1) == y.to(device, non_blocking=transfer)).cpu())
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


def accuracy(algorithm, dataset: Dataset, device, batch_size: int = EVAL_BATCH_SIZE,
             num_workers: int = 0, subsets: dict[str, torch.Tensor] | None = None,
             seed: int = 0) -> dict[str, float]:
    """:func:`accuracies` of one dataset (``seed``: its batches' augmentation seed)."""
    return accuracies(algorithm, [(dataset, seed, subsets)], device, batch_size, num_workers)[0]


def eval_seed(name: str) -> int:
    """The augmentation seed of split ``name``'s evaluation batches (``env0_out``, ...): the same
    in every job and every re-evaluation, so an augmented split's accuracy is a function of the
    model alone (:func:`eval_batches`)."""
    return seed_hash("eval", name)


def evaluate(algorithm, splits: Splits, device, num_workers: int = 0, names=None,
             batch_size: int = EVAL_BATCH_SIZE, pool=None) -> dict[str, float]:
    """Accuracy keys of one record: ``env{i}_{in,out,uda}_acc`` for every split (DomainBed's) of
    ``names`` (None: every split; ``--eval_splits selection``'s are fewer), and for every named
    subset of a test environment ``env{i}_{in,out}_{name}_acc`` (NaN when the subset is empty)
    and ``env{i}_{in,out}_{name}_count``. Batches of ``batch_size``, augmented splits' seeded by
    (split, batch index) (:func:`eval_seed`); the job's worker ``pool`` makes them (else one
    loader of ``num_workers`` workers)."""
    named = splits.eval_named()
    if names is not None:
        unknown = sorted(set(names) - {name for name, _, _ in named})
        if unknown:
            raise ValueError(f"no split named {', '.join(unknown)} in this job")
        named = [entry for entry in named if entry[0] in set(names)]
    masks = [splits.subset_masks(split, env) for _, split, env in named]
    results = accuracies(algorithm, [(split, eval_seed(name), subsets) for (name, split, _),
                                     subsets in zip(named, masks)], device,
                         batch_size=batch_size, num_workers=num_workers, pool=pool)
    out = {}
    for (name, _, _), subsets, accs in zip(named, masks, results):
        out[name + "_acc"] = accs[""]
        for subset, mask in subsets.items():
            out[f"{name}_{subset}_acc"] = accs[subset]
            out[f"{name}_{subset}_count"] = int(mask.sum())
    return out
