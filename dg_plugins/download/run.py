"""Downloading datasets: per dataset, skip when present, fetch its files, check them, extract
into a staging folder renamed into place; all datasets asked, one failure not stopping the others
(``docs/download.md``). Locks keep two runs from one folder."""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
from typing import Callable, Iterable
from urllib.parse import urlsplit

from dg_plugins.download.fetch import (
    URL_SCHEMES, Options, Reporter, check_free_space, disk_full_message, human_size, is_disk_full,
    obtain, remove_part, to_check,
)
from dg_plugins.download.prepare import (
    PREPARE, dataset_status, domainnet20_problem, image_layout_problem, split_lists_problems,
)
from dg_plugins.download.sources import (
    ALIASES, BUILT_IN, DATASET_SPECS, DOWNLOADS_FOLDER, EXTRACT_FACTOR, SOURCES_BY_NAME,
    CorruptArchive, DownloadError, Source, UnknownDataset, UsageError, download_command,
    resolve_names, sources_of,
)
from dg_plugins.layouts import DOMAIN_FOLDERS, visible_subfolders

try:
    import fcntl
except ImportError:  # Windows: no locks
    fcntl = None

#: Inside a staging folder: a finished download's archives, removed with it.
ARCHIVES_IN_STAGING = ".archives"


class DownloadFailed(DownloadError):
    """``failures`` (dataset -> message) and ``results`` (as :func:`download` returns them)."""

    def __init__(self, failures: dict[str, str], results: list[tuple[str, str]]):
        super().__init__("\n".join(failures.values()))
        self.failures = failures
        self.results = results


def _flock(path: str, operation: int, opener: Callable[[], int]) -> int | None:
    """``opener()``'s descriptor of ``path`` locked with ``operation``, retried until the file
    locked is the one at ``path`` (not one removed meanwhile); None when ``LOCK_NB`` fails."""
    while True:
        fd = opener()
        try:
            fcntl.flock(fd, operation)
        except OSError:
            os.close(fd)
            if operation & fcntl.LOCK_NB:
                return None
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        os.close(fd)


@contextlib.contextmanager
def _lock(path: str, what: str, busy_ok: bool = False):
    """An exclusive lock on the file ``path``, removed on exit; yields True, or False when held
    elsewhere and ``busy_ok`` (else :class:`DownloadError`)."""
    if fcntl is None:
        yield True
        return
    fd = _flock(path, fcntl.LOCK_EX | fcntl.LOCK_NB,
                lambda: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666))
    if fd is None and not busy_ok:
        raise DownloadError(f"another download of {what} into the same folder is running "
                            f"(it holds {path}); wait for it to finish")
    try:
        yield fd is not None
    finally:
        if fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def _downloads_folder(data_dir: str, create: bool = True):
    """``<data_dir>/downloads/`` (None when absent and not ``create``) under a shared lock;
    removed on exit when empty and no other download holds it."""
    downloads = os.path.join(data_dir, DOWNLOADS_FOLDER)
    if not create and not os.path.isdir(downloads):
        yield None
        return
    if fcntl is None:
        os.makedirs(downloads, exist_ok=True)
        yield downloads
        return

    def open_folder() -> int:
        while True:
            os.makedirs(downloads, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):  # removed by the last one out just now
                return os.open(downloads, os.O_RDONLY)

    fd = _flock(downloads, fcntl.LOCK_SH, open_folder)
    try:
        yield downloads
    finally:
        with contextlib.suppress(OSError):  # not while another download uses it or it holds files
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rmdir(downloads)
        os.close(fd)


def _set_aside_unverified(paths: dict[str, str], sources: list[Source]) -> str:
    """Move the files (of ``paths``) no checksum vouched for to ``.corrupt``; the note saying so."""
    moved = [paths[s.name] for s in sources if s.name in paths and not s.sha256 and not s.md5]
    for path in moved:
        os.replace(path, path + ".corrupt")
    return (f" {', '.join(os.path.basename(p) for p in moved)} moved to "
            f"{', '.join(p + '.corrupt' for p in moved)};") if moved else ""


def _paths(dataset: str, data_dir: str) -> tuple[str, str]:
    """The lock (the base dataset's, for files that join it) and the staging folder."""
    spec = DATASET_SPECS[dataset]
    return (os.path.join(data_dir, f".{spec.folder}.download-lock"),
            os.path.join(data_dir, f".{dataset if spec.adds_to else spec.folder}.download-tmp"))


def _remove_stale_staging(dataset: str, staging: str, downloads: str | None,
                          report: Reporter) -> None:
    """Remove an interrupted run's staging folder; its archives back to ``downloads`` if given."""
    if not os.path.exists(staging):
        return
    archives = os.path.join(staging, ARCHIVES_IN_STAGING)
    names = sorted(os.listdir(archives)) if os.path.isdir(archives) else []
    for name in names if downloads is not None else []:
        if not os.path.exists(os.path.join(downloads, name)):
            os.replace(os.path.join(archives, name), os.path.join(downloads, name))
    what = ("" if not names else f" ({', '.join(names)} moved back to {downloads})"
            if downloads is not None else f", with {', '.join(names)} (no longer needed)")
    report(f"{dataset}: removing {staging}, left by an interrupted run{what}")
    shutil.rmtree(staging)


def _remove_corrupt(dataset: str, downloads: str, report: Reporter) -> None:
    for source in sources_of(dataset):
        path = os.path.join(downloads, source.name + ".corrupt")
        if os.path.isfile(path):
            os.remove(path)
            report(f"{dataset}: removed {path}, set aside by an earlier run")


def tidy_present(dataset: str, data_dir: str, options: Options, report: Reporter) -> None:
    """For a dataset that checks out: remove what earlier runs left and name its files still in
    ``downloads/`` (nothing while another run holds its lock)."""
    lock, staging = _paths(dataset, data_dir)
    with _lock(lock, dataset, busy_ok=True) as held:
        if not held:
            return
        _remove_stale_staging(dataset, staging, None, report)
        with _downloads_folder(data_dir, create=False) as downloads:
            if downloads is None:
                return
            _remove_corrupt(dataset, downloads, report)
            paths = [os.path.join(downloads, source.name) for source in sources_of(dataset)]
            for path in paths:
                if os.path.isfile(path + ".part"):
                    remove_part(path + ".part")  # with its validators
                    report(f"{dataset}: removed {path}.part, left by an interrupted run")
            kept = [path for path in paths if os.path.isfile(path)]
            if kept and not options.keep_archives:
                size = human_size(sum(os.path.getsize(p) for p in kept))
                report(f"{dataset}: {', '.join(kept)} ({size}) not needed any more (the dataset "
                       "checks out without them): left as they are; delete them to free the space")


def download_dataset(dataset: str, data_dir: str, options: Options, report: Reporter) -> str:
    """Make ``dataset`` present under ``data_dir``: "present" or "downloaded"."""
    spec = DATASET_SPECS[dataset]
    base, target = spec.adds_to, os.path.join(data_dir, spec.folder)
    if base and (base_status := dataset_status(base, data_dir))[0] != "ok":
        raise DownloadError(
            f"{dataset}: the lists name {base}'s images and are checked against them, but "
            f"{base_status[1]}: download {base} with them: "
            f"{download_command([base, dataset], data_dir)}")

    def check() -> tuple[str, str]:
        status, detail = dataset_status(dataset, data_dir)
        if status == "broken":
            raise DownloadError(
                f"{dataset}: {detail}. The lists in {target} were left as they are: move the "
                f"list that does not read away (or delete it), then rerun to download it."
                if base else f"{dataset}: {target} exists but its layout does not check out: "
                f"{detail}. It was left as it is: move it away (or delete it), then rerun to "
                f"download {dataset}.")
        return status, detail

    status, detail = check()
    if status == "ok":
        report(f"{dataset}: already present ({detail}); skipped")
        tidy_present(dataset, data_dir, options, report)
        return "present"
    lock, staging = _paths(dataset, data_dir)
    with _lock(lock, f"{base} or {dataset}" if base else dataset), \
            _downloads_folder(data_dir) as downloads:
        status, detail = check()  # another run may have finished meanwhile
        if status == "ok":
            report(f"{dataset}: already present ({detail if base else target}); skipped")
            return "present"
        if status == "partial":
            report(f"{dataset}: {detail}")
        _remove_stale_staging(dataset, staging, downloads, report)
        (download_split_lists if base else _download_archives)(dataset, data_dir, downloads,
                                                               staging, options, report)
        if options.keep_archives:
            report(f"{dataset}: the downloaded files are kept in {downloads}")
        _remove_corrupt(dataset, downloads, report)
    return "downloaded"


def _download_archives(dataset: str, data_dir: str, downloads: str, staging: str,
                       options: Options, report: Reporter) -> None:
    """Fetch and check the dataset's files, extract them in ``staging``, rename into place."""
    spec = DATASET_SPECS[dataset]
    target = os.path.join(data_dir, spec.folder)
    sources = [to_check(s, options) for s in sources_of(dataset)]
    missing = [s for s in sources if not os.path.isfile(os.path.join(downloads, s.name))]
    known = [s.size for s in missing]
    still = f"{human_size(sum(known))} still to fetch" if None not in known else "size unknown"
    report(f"{dataset}: downloading {len(sources)} file(s) into {downloads} ({still})")
    if None not in known:
        part_paths = (os.path.join(downloads, s.name + ".part") for s in missing)
        parts = sum(os.path.getsize(p) for p in part_paths if os.path.exists(p))
        extracted = spec.extracted_size if spec.extracted_size is not None else int(
            sum(s.size or 0 for s in sources) * EXTRACT_FACTOR)
        check_free_space(data_dir, sum(known) - parts + extracted,
                         f"{dataset} (its archives and their extracted files)")
    archives = {s.name: obtain(s, downloads, options, report) for s in sources}
    os.makedirs(staging)
    try:
        PREPARE[dataset](spec, archives, staging, report)
        if problem := image_layout_problem(dataset, staging):
            raise CorruptArchive(f"the extracted files do not check out: {problem}")
    except BaseException as err:  # Ctrl-C too: give the space back (a kill: a rerun does)
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, CorruptArchive):
            where = _set_aside_unverified(archives, sources)  # not to be reused
            raise DownloadError(f"{dataset}: {err}: a corrupted, incomplete or wrong archive. "
                                f"Nothing was put in {target};{where} rerun to download it "
                                "again.") from None
        if isinstance(err, OSError):
            what = disk_full_message(data_dir, f"extracting {dataset}") if is_disk_full(err) \
                else f"could not extract {dataset} into {staging}: {err}"
            raise DownloadError(
                f"{dataset}: {what}. The half-extracted files were removed; the downloaded "
                f"files are kept in {downloads} (not fetched again). Free some space or "
                "choose another --data_dir, then rerun.") from None
        raise
    if not options.keep_archives:  # they leave with the staging folder
        os.makedirs(os.path.join(staging, ARCHIVES_IN_STAGING))
        for name, path in archives.items():
            os.replace(path, os.path.join(staging, ARCHIVES_IN_STAGING, name))
    os.rename(os.path.join(staging, spec.folder), target)
    shutil.rmtree(staging)
    report(f"{dataset}: done: {target} checks out")


def download_split_lists(dataset: str, data_dir: str, downloads: str, staging: str,
                         options: Options, report: Reporter) -> None:
    """PACS_splits: PACS's missing lists, checked against its images before they go beside its
    domain folders (``docs/download.md``)."""
    base = DATASET_SPECS[dataset].adds_to
    target = os.path.join(data_dir, DATASET_SPECS[dataset].folder)
    missing = [to_check(s, options) for s in sources_of(dataset)
               if not os.path.isfile(os.path.join(target, s.name))]
    report(f"{dataset}: downloading {len(missing)} list(s) into {downloads}")
    lists = {s.name: obtain(s, downloads, options, report) for s in missing}
    if problems := split_lists_problems(data_dir, lists):
        first, *others = problems
        more = f" (and {len(others)} other list(s): {', '.join(others)})" if others else ""
        where = _set_aside_unverified({n: lists[n] for n in problems}, missing)
        raise DownloadError(
            f"{dataset}: {problems[first]}{more}. Nothing was put in {target};{where} rerun to "
            f"download {'them' if others else 'it'} again.")
    os.makedirs(staging)
    for name, path in lists.items():
        shutil.copyfile(path, os.path.join(staging, name))
    for name in lists:
        os.replace(os.path.join(staging, name), os.path.join(target, name))
    shutil.rmtree(staging)
    status, detail = dataset_status(dataset, data_dir)
    if status != "ok":  # e.g. a list removed meanwhile by hand
        raise DownloadError(f"{dataset}: after putting the lists in place: {detail}; rerun")
    report(f"{dataset}: done: {detail}; train on them with --dataset {base} --hparams "
           "'{\"data_split\": \"official\"}'")
    if not options.keep_archives:
        for path in lists.values():
            os.remove(path)


def check_not_inside(dataset: str, data_dir: str) -> None:
    """Raise :class:`UsageError` when ``data_dir`` already is ``dataset``'s own folder."""
    spec, domains = DATASET_SPECS.get(dataset), DOMAIN_FOLDERS.get(dataset)
    if spec is None or not domains or not os.path.isdir(data_dir) \
            or os.path.isdir(os.path.join(data_dir, spec.folder)):
        return
    if set(domains) <= set(visible_subfolders(data_dir)):
        meant = os.path.dirname(os.path.abspath(data_dir))
        meant = meant if os.path.isabs(data_dir) else os.path.relpath(meant)
        raise UsageError(f"{data_dir} already holds {dataset}'s domain folders "
                         f"({', '.join(domains)}): it is {dataset}'s own folder, and --data_dir "
                         f"is the one holding it (<data_dir>/{spec.folder}); did you mean "
                         f"--data_dir {meant}? Nothing was downloaded.")


def download(names: Iterable[str], data_dir: str, options: Options | None = None,
             report: Reporter | None = None) -> list[tuple[str, str]]:
    """Download ``names`` into ``data_dir``: ``[(dataset, "present" | "downloaded" | "built
    in")]``; :class:`UsageError` before anything, :class:`DownloadFailed` after the others."""
    options = options or Options()
    report = report or Reporter()
    resolved = resolve_names(names)
    for name in [*options.urls, *options.sha256]:  # an unknown file or URL scheme: UsageError
        if name not in SOURCES_BY_NAME:
            close = difflib.get_close_matches(name, list(SOURCES_BY_NAME), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UnknownDataset(f"unknown file {name!r}{hint}; the files (see --list): "
                                 + ", ".join(SOURCES_BY_NAME))
    for name, url in options.urls.items():
        if (scheme := urlsplit(url).scheme) not in URL_SCHEMES:
            raise UsageError(f"--url {name}={url}: unsupported URL scheme {scheme or '(none)'!r}; "
                             f"give an http://, https:// or file:///path/to/{name} URL")
    for name, _ in resolved:
        check_not_inside(name, data_dir)
    os.makedirs(data_dir, exist_ok=True)
    results: list[tuple[str, str]] = []
    failures: dict[str, str] = {}
    for index, (name, notes) in enumerate(resolved):
        for note in notes:
            report(f"{note}.")
        if name in BUILT_IN:
            results.append((name, "built in"))
            continue
        base = DATASET_SPECS[name].adds_to
        if base in failures:
            failures[name] = f"{name}: not attempted: its files join {base}, which failed"
            continue
        try:
            results.append((name, download_dataset(name, data_dir, options, report)))
            if ALIASES["DomainNet20"][1] in notes:
                if problem := domainnet20_problem(data_dir):
                    raise DownloadError(f"DomainNet20: {problem}")
                report(f"DomainNet20: its 20 classes are in "
                       f"{os.path.join(data_dir, DATASET_SPECS['DomainNet'].folder)}")
        except DownloadError as err:
            failures[name] = str(err)
            if rest := [n for n, _ in resolved[index + 1:] if n not in BUILT_IN]:
                report(f"{name}: failed (the reason is given at the end); going on with "
                       f"{', '.join(rest)}")
    if failures:
        raise DownloadFailed(failures, results)
    return results
