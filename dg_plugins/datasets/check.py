"""The logic of ``python -m dg_plugins.scripts.check_data``: name the layout found, refuse a tree
one level off (:func:`one_level_off`, which train runs too), then decode every image of an
image-folder dataset as training does, in a process pool, and list the unreadable ones."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections import Counter
from typing import Callable, Iterable, Sequence

from dg_plugins import catalog, layouts
from dg_plugins.registry import DATASETS, close_names

#: Below this many files the check runs in this process (a pool costs more than it saves).
MIN_FILES_FOR_POOL = 64
#: Without a terminal, a plain progress line every tenth of the files, but at least this many apart.
PLAIN_PROGRESS_MIN = 1000


def available_cpus() -> int:
    """CPUs this process may run on (e.g. a Slurm allocation)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class BadInput(Exception):
    """A problem with the command line or the data folder (exit status 2)."""


def load_dataset(name: str, data_dir: str):
    """The dataset built as train builds it (no augmentation); :class:`BadInput` if it cannot."""
    from dg_plugins.datasets.image_folder import MultipleEnvironmentImageFolder

    def image_folders(cls) -> bool:
        return isinstance(cls, type) and issubclass(cls, MultipleEnvironmentImageFolder)

    choices = [known for known in DATASETS.list() if image_folders(DATASETS.get(known))]
    if name not in DATASETS:
        close = close_names(name, choices)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise BadInput(f"unknown dataset {name!r}{hint}; image-folder datasets: "
                       f"{', '.join(choices)} "
                       "(a dataset of your own: register it with make_image_folder_dataset in a "
                       "module named in $DG_PLUGINS_IMPORT)")
    cls = DATASETS.get(name)
    if not image_folders(cls):
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
    off = one_level_off(name, dataset.root, dataset.environment_folders, folder is None,
                        catalog.image_folder_layout(name))
    if off is not None:  # "classes" holding folders, not images: a tree one level off
        raise BadInput(off)
    return dataset


def _shown(names: Sequence[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit
                                       else "")


def one_level_off(name: str, root: str, domains: Sequence[str], data_dir_is_root: bool,
                  layout: str) -> str | None:
    """The error for a tree whose class folders hold only folders of images (a wrapper folder per
    domain, or "classes" that are domains), else None; ``data_dir_is_root``: the fix can be
    another ``--data_dir``. Torch-free (train runs it too)."""
    inner: dict[str, dict[str, list[str]]] = {}
    for domain in domains:
        inner[domain] = {}
        for cls in layouts.visible_subfolders(os.path.join(root, domain)) or [None]:
            if cls is None:
                return None
            with os.scandir(os.path.join(root, domain, cls)) as entries:
                entries = list(entries)
            own_images = any(e.is_file() and layouts.is_image_file(e.name) for e in entries)
            subfolders = sorted(e.name for e in entries
                                if e.is_dir() and not e.name.startswith("."))
            if own_images or not subfolders:
                return None
            inner[domain][cls] = subfolders
    if not inner or not all(layouts.has_image(os.path.join(root, d, c))
                            for d in inner for c in inner[d]):
        return None
    if all(len(classes) == 1 for classes in inner.values()):
        first, classes = next(iter(inner.items()))
        wrapper, true_classes = next(iter(classes.items()))
        wrappers = [f"{d}/{next(iter(c))}" for d, c in inner.items()]
        source, target = os.path.join(root, first, wrapper), os.path.join(root, first)
        return (f"{name}: each domain folder of {root} holds one folder ({_shown(wrappers)}) "
                f"whose subfolders ({_shown(true_classes)}) hold the images: the class folders "
                f"are one level down, and every image of a domain would get one label; move them "
                f"up into their domain folders (e.g. mv {shlex.quote(source)}/* "
                f"{shlex.quote(target)}/, for each domain). {layout}.")
    shared = {}
    for domain, classes in inner.items():
        if len(classes) < 2:
            continue
        seen = Counter(sub for subfolders in classes.values() for sub in subfolders)
        common = sorted(sub for sub, count in seen.items() if count > 1)
        if not common:
            return None  # class folders with subfolders of their own: a hierarchy, not a level
        shared[domain] = common
    domain, common = next(iter(shared.items()))
    looks = [f"{domain}/{c}" for c in inner[domain]]
    fix = (f"did you mean --data_dir {os.path.join(root, domain)}?" if data_dir_is_root
           else f"move the image tree up one level. {layout}.")
    return (f"{name}: the class folders of {root} ({_shown(looks)}) hold no image of their own "
            f"but folders of the same names ({_shown(common)}): they look like domain folders, "
            f"and {root} one level above an image tree; {fix}")


def check_files(paths: Sequence[str], workers: int,
                progress: bool = False) -> Iterable[tuple[str, str | None]]:
    """``(path, error or None)`` per path, in order, decoded by ``workers`` processes (or here)."""
    from dg_plugins.datasets.image_folder import image_error

    with contextlib.ExitStack() as stack:
        results = map(image_error, paths)
        if workers > 1 and len(paths) >= MIN_FILES_FOR_POOL:
            from concurrent.futures import ProcessPoolExecutor

            pool = stack.enter_context(ProcessPoolExecutor(max_workers=workers))
            results = pool.map(image_error, paths,
                               chunksize=max(1, min(64, len(paths) // (workers * 8))))
        if progress:
            from tqdm import tqdm

            results = stack.enter_context(tqdm(results, total=len(paths), desc="checking images",
                                               unit="img", file=sys.stderr))
        for error, path in zip(results, paths):  # results first: the bar sees their end
            yield path, error


def run_check(dataset, workers: int, progress: bool,
              out: Callable[[str], None] = print) -> int:
    """Say the layout found, check every image of ``dataset`` (naming each unreadable one), then
    sum up per environment; returns the number unreadable."""
    name = type(dataset).__name__
    files = [(env_index, path) for env_index, env in enumerate(dataset.datasets)
             for path, _ in env.samples]
    out(f"Layout: {os.path.join(dataset.root, '<domain>', '<class>', '<image>')} with "
        f"{len(dataset.environment_folders)} domains and {len(dataset.classes)} classes:")
    counts = Counter()
    for folder, env in zip(dataset.environment_folders, dataset.datasets):
        per_class = Counter(label for _, label in env.samples)
        counts.update(per_class)
        out(f"  domain {folder}: {len(per_class)} classes, {len(env.samples)} images")
    classes = [f"{cls} {counts[index]}" for index, cls in enumerate(dataset.classes)]
    out(f"  images per class: {_shown(classes, 12)}")
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
    n_bad = sum(bad.values())
    out(f"{n_bad} of {len(files)} images unreadable:" if n_bad
        else f"All {len(files)} images of {name} are readable:")
    for i, (label, folder) in enumerate(zip(dataset.ENVIRONMENTS, dataset.environment_folders)):
        where = label if label == folder else f"{label} ({folder})"
        out(f"  environment {where}: {bad[i]} unreadable of {len(dataset.datasets[i].samples)}")
    if n_bad:
        out(f"Remove or replace the {n_bad} unreadable file(s) listed above (e.g. restore them "
            f"from the original archive), then run this check again.")
    return n_bad
