"""Images per environment of a dataset (counted on disk, built in, or recorded in paper_settings)
and per split of a job, which a sweep's costs follow from (docs/reproduce.md)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from dg_plugins import catalog
from dg_plugins.reference import paper_settings as ps
from dg_plugins.registry import DATASETS
from dg_plugins.job import selection as job_selection
from dg_plugins.job import sizes as job_sizes
from dg_plugins.sweep.jobs import num_environments


class UsageError(ValueError):
    """Bad input: printed as one line, exit status 2."""


def n_environments(dataset: str, data_dir: str | None) -> int:
    """How many environments a job of ``dataset`` has: declared, or found under ``data_dir``."""
    envs = catalog.DATASET_ENVIRONMENTS.get(dataset)
    return len(envs) if envs else num_environments(dataset, data_dir)


@dataclass(frozen=True)
class Sizes:
    """Images per environment of a dataset and where the counts come from."""
    counts: tuple[int, ...]
    source: str


def register_datasets() -> None:
    """Register every dataset of dg_plugins (on first use: the datasets import torch)."""
    import dg_plugins.datasets  # noqa: F401


@functools.cache
def dataset_sizes(dataset: str, data_dir: str | None) -> Sizes:
    """Images per environment of ``dataset``: counted on disk, built in, else recorded."""
    return (_count_on_disk(dataset, data_dir) or _built_in(dataset, data_dir)
            or _recorded(dataset, data_dir))


def _built_in(dataset: str, data_dir: str | None) -> Sizes | None:
    """Images per environment of an in-memory dataset (under ``--data_dir builtin``: built here)."""
    register_datasets()
    if dataset not in DATASETS or not getattr(DATASETS.get(dataset), "IN_MEMORY", False):
        return None
    if dataset == "DigitsOffline":
        from dg_plugins.datasets import digits_offline  # imports torch

        return Sizes(tuple(digits_offline.SIZES[d] for d in digits_offline.ENVIRONMENTS),
                     "DigitsOffline's generator sizes (dg_plugins/datasets/digits_offline.py "
                     "SIZES)")
    if data_dir != "builtin":
        return None
    try:
        built = DATASETS.get(dataset)(data_dir, [], {})
    except (OSError, ValueError, ImportError):
        return None
    return Sizes(tuple(len(env) for env in built), f"counted in the built-in {dataset}")


def _dataset_folder(dataset: str, data_dir: str | None) -> str | None:
    if data_dir is None:
        return None
    if catalog.IMAGE_FOLDER_DATASETS.get(dataset, "") is None:  # the generic ImageFolder
        return data_dir
    register_datasets()
    if dataset not in DATASETS:
        return None
    folder = getattr(DATASETS.get(dataset), "FOLDER_NAME", None)
    return os.path.join(data_dir, folder) if folder else None


def _count_on_disk(dataset: str, data_dir: str | None) -> Sizes | None:
    root = _dataset_folder(dataset, data_dir)
    if root is None or not os.path.isdir(root):
        return None
    from dg_plugins.datasets.image_folder import list_images, visible_subfolders  # imports torch

    envs = visible_subfolders(root)
    expected = catalog.DATASET_ENVIRONMENTS.get(dataset)
    if expected is not None and len(envs) != len(expected):
        raise UsageError(f"{root} holds {len(envs)} domain folders ({', '.join(envs)}), {dataset} "
                         f"has {len(expected)}: fix the folder or pass another --data_dir")
    classes = None
    if dataset == "DomainNet20":
        from dg_plugins.datasets.domainnet20 import CLASSES as classes  # imports torch
    counts = [sum(len(list_images(os.path.join(root, env, c)))
                  for c in visible_subfolders(os.path.join(root, env))
                  if classes is None or c in classes) for env in envs]
    return Sizes(tuple(counts), f"counted on disk in {root}")


def _recorded(dataset: str, data_dir: str | None) -> Sizes:
    recorded = ps.DATASET_SIZES.get(dataset)
    where = _dataset_folder(dataset, data_dir) or (data_dir or "no --data_dir")
    if recorded is None:
        raise UsageError(f"no image counts of {dataset}: no data in {where} and none recorded "
                         "in dg_plugins/reference/paper_settings.py (DATASET_SIZES)")
    return Sizes(tuple(recorded.value), f"recorded counts ({where} not found): {recorded.source}")


#: The official split lists a dataset with ``data_split: "official"`` reads, by kind.
OFFICIAL_LIST_KINDS = ("train", "crossval", "test")


def official_list_sizes(dataset: str, data_dir: str | None) -> tuple[dict, str]:
    """``({kind: images per environment}, origin)`` of the official ``*_kfold.txt`` lists."""
    root = _dataset_folder(dataset, data_dir)
    if root is not None and os.path.isdir(root):
        from dg_plugins.datasets.image_folder import visible_subfolders  # imports torch

        counts: dict[str, list[int]] = {kind: [] for kind in OFFICIAL_LIST_KINDS}
        envs = visible_subfolders(root)
        paths = [(kind, os.path.join(root, f"{env}_{kind}_kfold.txt")) for env in envs
                 for kind in OFFICIAL_LIST_KINDS]
        if envs and all(os.path.isfile(path) for _, path in paths):
            for kind, path in paths:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    counts[kind].append(sum(1 for line in handle if line.strip()))
            return ({kind: tuple(v) for kind, v in counts.items()},
                    f"official split lists counted in {root}")
    train, val = ps.OFFICIAL_TRAIN_SIZES.get(dataset), ps.OFFICIAL_VAL_SIZES.get(dataset)
    whole = ps.DATASET_SIZES.get(dataset)
    if train is None or val is None or whole is None:
        raise UsageError(f"no official split sizes recorded for {dataset}")
    return ({"train": tuple(train.value), "crossval": tuple(val.value),
             "test": tuple(whole.value)}, f"official split lists: {train.source}")


#: The ``--eval_splits`` values, printed cheapest first.
EVAL_SPLITS = job_selection.EVAL_SPLITS[::-1]


def split_sizes(a: dict, hparams: dict, origins: set) -> dict[str, int]:
    """Every split of the job of train args ``a`` with its size (``origins``: where from)."""
    dataset, test_envs = a["dataset"], set(a["test_envs"])
    data_dir = a.get("data_dir")
    n_envs = n_environments(dataset, data_dir)
    if hparams.get("data_split") == "official":
        lists, origin = official_list_sizes(dataset, data_dir)
        pairs = [(lists["test" if e in test_envs else "train"][e], lists["crossval"][e])
                 for e in range(n_envs)]
    else:
        sizes = dataset_sizes(dataset, data_dir)
        origin = sizes.source
        pairs = job_sizes.random_holdout_pairs(sizes.counts, a.get("holdout_fraction", 0.2))
    origins.add(origin)
    return job_sizes.split_sizes(pairs, test_envs, a.get("uda_holdout_fraction") or 0.0)


def evaluated_by_value(a: dict, names: list[str]) -> dict[str, list[str]]:
    """``{--eval_splits value: the splits a record evaluates}`` for the job of train args ``a``."""
    n_envs = n_environments(a["dataset"], a.get("data_dir"))
    uda = sum(name.endswith("_uda") for name in names)
    return {value: job_selection.evaluated_splits(value, a["test_envs"], n_envs, uda,
                                                  udg="label_fraction" in a)
            for value in EVAL_SPLITS}
