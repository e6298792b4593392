"""The logic of ``python -m dg_plugins.scripts.check_data`` (usage and exit statuses: its
docstring): find every unreadable image of an image-folder dataset by decoding it as training does
(:func:`dg_plugins.datasets.image_folder.image_error`), in a process pool, with a summary per
environment."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Callable, Iterable, Sequence

from dg_plugins.help_text import CommandParser

#: Below this many files the check runs in this process (a pool costs more than it saves).
MIN_FILES_FOR_POOL = 64
#: Without a terminal, a plain progress line every tenth of the files, but at least this many apart.
PLAIN_PROGRESS_MIN = 1000


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m dg_plugins.scripts.check_data",
        description="Decode every image of an image-folder dataset and list the unreadable "
                    "ones (truncated, garbage, empty or unreadable files), before a long run.")
    parser.add_argument("--dataset", required=True,
                        help="a registered image-folder dataset, e.g. PACS or ImageFolder")
    parser.add_argument("--data_dir", required=True,
                        help="the --data_dir given to train (e.g. the folder holding PACS/)")
    parser.add_argument("--workers", type=int, default=None,
                        help="decoding processes (default: the CPUs available to this process; "
                             "0: decode in this process)")
    return parser


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a Slurm allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class BadInput(Exception):
    """A problem with the command line or the data folder (exit status 2)."""


def image_folder_datasets() -> list[str]:
    """Registered datasets built from image folders."""
    from dg_plugins.datasets.image_folder import MultipleEnvironmentImageFolder
    from dg_plugins.registry import DATASETS

    return [name for name in DATASETS.list()
            if isinstance(DATASETS.get(name), type)
            and issubclass(DATASETS.get(name), MultipleEnvironmentImageFolder)]


def load_dataset(name: str, data_dir: str):
    """Build the dataset as train would (no augmentation; plugins loaded first, by the caller):
    its layout is checked and its image files listed. Raises :class:`BadInput` for unknown
    names, datasets without image files and missing or badly laid-out folders."""
    from dg_plugins import catalog, layouts
    from dg_plugins.datasets.image_folder import MultipleEnvironmentImageFolder
    from dg_plugins.registry import DATASETS, close_names

    choices = image_folder_datasets()
    if name not in DATASETS:
        close = close_names(name, choices)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise BadInput(f"unknown dataset {name!r}{hint}; image-folder datasets: "
                       f"{', '.join(choices)} "
                       "(a dataset of your own: register it with make_image_folder_dataset in a "
                       "module named in $DG_PLUGINS_IMPORT)")
    cls = DATASETS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, MultipleEnvironmentImageFolder)):
        kind = "in-memory tensors" if getattr(cls, "IN_MEMORY", False) else "not image files"
        raise BadInput(f"dataset {name!r} is not an image-folder dataset (its data are {kind}), "
                       f"so there are no image files to check; image-folder datasets: "
                       f"{', '.join(choices)}")
    folder = getattr(cls, "FOLDER_NAME", None)
    root = os.path.join(data_dir, folder) if folder else data_dir
    if cls.ENVIRONMENTS is None and os.path.isdir(root):  # domains discovered: the tree's level
        shallow = layouts.domain_folder_error(name, root, layouts.visible_subfolders(root))
        if shallow is not None:  # "domains" whose "classes" are images: a --data_dir too low
            raise BadInput(shallow)
    try:
        dataset = cls(data_dir, [], None)
    except (FileNotFoundError, NotADirectoryError, ValueError) as err:
        raise BadInput(str(err)) from err
    nested = catalog.nested_tree_error(name, dataset.root, dataset.environment_folders)
    if nested is not None:  # one "domain" whose "classes" are domains: not a tree to train on
        raise BadInput(str(nested))
    return dataset


def check_files(paths: Sequence[str], workers: int,
                progress: bool = False) -> Iterable[tuple[str, str | None]]:
    """Yield ``(path, error or None)`` for every path, in order, decoding with ``workers``
    processes (in this process when ``workers`` <= 1 or there are few files)."""
    from dg_plugins.datasets.image_folder import image_error

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(paths), desc="checking images", unit="img", file=sys.stderr)
    try:
        if workers <= 1 or len(paths) < MIN_FILES_FOR_POOL:
            results = map(image_error, paths)
            yield from _with_progress(paths, results, bar)
        else:
            from concurrent.futures import ProcessPoolExecutor

            chunksize = max(1, min(64, len(paths) // (workers * 8)))
            with ProcessPoolExecutor(max_workers=workers) as pool:
                results = pool.map(image_error, paths, chunksize=chunksize)
                yield from _with_progress(paths, results, bar)
    finally:
        if bar is not None:
            bar.close()


def _with_progress(paths, results, bar):
    for path, error in zip(paths, results):
        if bar is not None:
            bar.update()
        yield path, error


def run_check(dataset, workers: int, progress: bool,
              out: Callable[[str], None] = print) -> int:
    """Check every image of a built image-folder ``dataset``; print each unreadable file as it is
    found, then a summary per environment; return the number of unreadable files. Without a
    progress bar, a plain ``checked N of M`` line marks every tenth of a large dataset."""
    name = type(dataset).__name__
    files = [(env_index, path) for env_index, env in enumerate(dataset.datasets)
             for path, _ in env.samples]
    out(f"Checking {len(files)} images of {name} in {dataset.root} "
        f"({len(dataset.datasets)} environments, {max(workers, 1)} process(es))...")
    report = out
    if progress:
        from tqdm import tqdm

        report = tqdm.write  # prints above the bar
    step = max(PLAIN_PROGRESS_MIN, len(files) // 10)
    bad = Counter()
    checked = check_files([p for _, p in files], workers, progress)
    for count, ((env_index, _), (path, error)) in enumerate(zip(files, checked), 1):
        if error is not None:
            bad[env_index] += 1
            report(f"unreadable: {path}: {error}")
        if not progress and count % step == 0 and count < len(files):
            out(f"  checked {count} of {len(files)}")
    totals = Counter(env_index for env_index, _ in files)
    n_bad = sum(bad.values())
    out(f"{n_bad} of {len(files)} images unreadable:" if n_bad
        else f"All {len(files)} images of {name} are readable:")
    for env_index, folder in enumerate(dataset.environment_folders):
        label = dataset.ENVIRONMENTS[env_index]
        where = label if label == folder else f"{label} ({folder})"
        out(f"  environment {where}: {bad[env_index]} unreadable of {totals[env_index]}")
    if n_bad:
        out(f"Remove or replace the {n_bad} unreadable file(s) listed above (e.g. restore them "
            f"from the original archive), then run this check again.")
    return n_bad
