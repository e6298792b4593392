"""Download DomainBed's datasets into DomainBed's layout under a data folder
(``python -m dg_plugins.scripts.download``).

The sources, archive layouts and post-processing follow DomainBed's
``domainbed/scripts/download.py`` (facebookresearch/DomainBed at b93c22a): PACS's ``kfold/``
folder becomes ``PACS/``, ``OfficeHomeDataset_10072016/`` becomes ``office_home/``, VLCS's tarball
holds ``VLCS/``, DomainNet's six zips each hold one domain folder and the files listed in
DomainBed's ``domainbed/misc/domain_net_duplicates.txt`` are deleted, TerraIncognita is built from
the Caltech Camera Traps (ECCV 2018) images and annotation files: locations 38, 43, 46 and 100,
ten categories, one ``location_<id>/<category>/`` folder each. MNIST's four IDX files go to
``MNIST/raw/`` as torchvision lays them out (gzipped and decompressed), where
:mod:`dg_plugins.datasets.mnist` and DomainBed's torchvision loader read them. DomainNet-20
(:mod:`dg_plugins.datasets.domainnet20`) reads DomainNet's folder, so it needs DomainNet.
PACS_splits is PACS's twelve official split lists ``<domain>_{train,crossval,test}_kfold.txt``
(Li et al., ICCV 2017; folder ``pacs_label`` of the PACS authors' Google Drive), which PACS's
dataset hparam ``data_split`` "official" reads from ``<data_dir>/PACS/`` (the DMG release's
protocol); they are checked against PACS's images, so PACS comes first
(:func:`download_split_lists`).

:data:`SOURCES` is the one table of files: dataset, file name, URL, size and checksums where
known, and where each value comes from (or why it is unknown).

What a download does, per dataset:

* **Skip** when the dataset's folder already checks out (:func:`dataset_status`: the dataset
  class reads it, its domain folders are the standard ones, its class count is the standard one).
  A folder that exists but does not check out is left as it is, with an error.
* **Fetch** each file into ``<data_dir>/downloads/``: plain HTTP(S) with ``urllib``, resumable
  (bytes go to ``<file>.part``; a later attempt or run asks for the rest with an HTTP Range
  request and appends only when the server answers 206 with the matching Content-Range, else it
  starts over), retried on a cut connection; Google Drive links through the optional ``gdown``.
  A complete file placed there by hand is used as it is. Free disk space is checked first.
* **Verify** the size and checksums the table knows (a mismatch moves the file to
  ``<file>.corrupt``); where none is known the output says so, and the archive must open and the
  extracted layout must check out.
* **Extract** into a staging folder ``<data_dir>/.<folder>.download-tmp`` (same parent, so the
  final rename is atomic), check the layout there, then rename it into place: a killed run never
  leaves a folder that looks complete, and a rerun removes the stale staging folder first. The
  archives are deleted afterwards unless asked to keep them.

Environment variable ``DG_PLUGINS_DOWNLOAD_TEST_DELAY`` (seconds, tests only) pauses after every
file written during extraction, so a test can kill a run while it extracts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import shutil
from typing import Iterable

from dg_plugins.datasets.download import fetch, prepare, sources
from dg_plugins.datasets.download.fetch import (
    Expected, Reporter, check_free_space, expected_for, human_size, obtain,
)
from dg_plugins.datasets.download.prepare import (
    PREPARE, dataset_status, domainnet20_problem, split_lists_problems, staged_problem,
)
from dg_plugins.datasets.download.sources import (
    ALIASES, BUILT_IN, DATASET_SPECS, DOWNLOADS_FOLDER, EXTRACT_FACTOR, SOURCES, SOURCES_BY_NAME,
    TEST_DELAY_ENV, CorruptArchive, DatasetSpec, DownloadError, Source, UnknownDataset,
    download_command, resolve_names, sources_of, table_lines,
)

__all__ = [
    "ALIASES", "BUILT_IN", "DATASET_SPECS", "SOURCES", "TEST_DELAY_ENV", "CorruptArchive",
    "DownloadError", "Options", "Reporter", "Source", "UnknownDataset", "dataset_status",
    "download", "download_command", "download_dataset", "download_split_lists", "fetch",
    "human_size", "prepare", "resolve_names", "sources", "sources_of", "table_lines",
]


@contextlib.contextmanager
def _lock(path: str, what: str):
    """An exclusive lock on ``path`` (none where fcntl is missing): two downloads of the same
    dataset into the same folder cannot run at once."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DownloadError(f"another download of {what} into the same folder is running "
                                f"(it holds {path}); wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclasses.dataclass
class Options:
    urls: dict[str, str] = dataclasses.field(default_factory=dict)
    sha256: dict[str, str | None] = dataclasses.field(default_factory=dict)
    keep_archives: bool = False
    retries: int = 3


def extracted_size(spec: DatasetSpec, expected: dict[str, Expected]) -> int:
    """Bytes the extracted dataset takes (estimated from the archives' sizes when not known)."""
    if spec.extracted_size is not None:
        return spec.extracted_size
    return int(sum(e.size or 0 for e in expected.values()) * EXTRACT_FACTOR)


def _discard_downloads(paths: Iterable[str], downloads: str, dataset: str, options: Options,
                       report: Reporter) -> None:
    """Delete the fetched files (and ``downloads`` when it is left empty) unless asked to keep
    them."""
    if options.keep_archives:
        report(f"{dataset}: the downloaded files are kept in {downloads}")
        return
    for path in paths:
        os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(downloads)  # only when empty


def _set_aside_unverified(paths: dict[str, str], expected: dict[str, Expected]) -> list[str]:
    """The files of ``paths`` that no checksum vouched for, moved to ``<file>.corrupt`` (a rerun
    fetches them again); returns their paths."""
    moved = [path for name, path in paths.items()
             if not expected[name].sha256 and not expected[name].md5]
    for path in moved:
        os.replace(path, path + ".corrupt")
    return moved


def _moved_note(moved: list[str]) -> str:
    if not moved:
        return ""
    return (f" {', '.join(os.path.basename(p) for p in moved)} moved to "
            f"{', '.join(p + '.corrupt' for p in moved)};")


def download_dataset(dataset: str, data_dir: str, options: Options, report: Reporter) -> str:
    """Make ``dataset`` present under ``data_dir``; returns "present" (nothing done) or
    "downloaded". Raises :class:`DownloadError`."""
    spec = DATASET_SPECS[dataset]
    if spec.adds_to:
        return download_split_lists(dataset, data_dir, options, report)
    target = os.path.join(data_dir, spec.folder)
    status, detail = dataset_status(dataset, data_dir)
    if status == "ok":
        report(f"{dataset}: already present ({detail}); skipped")
        return "present"
    if status == "broken":
        raise DownloadError(
            f"{dataset}: {target} exists but its layout does not check out: {detail}. It was "
            f"left as it is: move it away (or delete it), then rerun to download {dataset}.")
    downloads = os.path.join(data_dir, DOWNLOADS_FOLDER)
    os.makedirs(downloads, exist_ok=True)
    staging = os.path.join(data_dir, f".{spec.folder}.download-tmp")
    lock = os.path.join(data_dir, f".{spec.folder}.download-lock")
    with _lock(lock, dataset):
        if dataset_status(dataset, data_dir)[0] == "ok":  # another run finished meanwhile
            report(f"{dataset}: already present ({target}); skipped")
            return "present"
        if os.path.exists(staging):
            report(f"{dataset}: removing {staging}, left by an interrupted run")
            shutil.rmtree(staging)
        sources = sources_of(dataset)
        expected = {s.name: expected_for(s, options.sha256) for s in sources}
        missing = [s for s in sources if not os.path.isfile(os.path.join(downloads, s.name))]
        known = [expected[s.name].size for s in missing]
        report(f"{dataset}: downloading {len(sources)} file(s) into {downloads} ("
               + (f"{human_size(sum(known))} still to fetch" if None not in known
                  else "size unknown") + ")")
        if None not in known:
            parts = sum(os.path.getsize(os.path.join(downloads, s.name + ".part"))
                        for s in missing
                        if os.path.exists(os.path.join(downloads, s.name + ".part")))
            check_free_space(data_dir, sum(known) - parts + extracted_size(spec, expected),
                             f"{dataset} (its archives and their extracted files)")
        archives = {}
        for source in sources:
            url = options.urls.get(source.name, source.url)
            archives[source.name] = obtain(source, downloads, url, expected[source.name],
                                           options.retries, report)
        os.makedirs(staging)
        try:
            PREPARE[dataset](spec, archives, staging, report)
            problem = staged_problem(dataset, staging)
            if problem:
                raise CorruptArchive(f"the extracted files do not check out: {problem}")
        except CorruptArchive as err:
            shutil.rmtree(staging, ignore_errors=True)
            where = _moved_note(_set_aside_unverified(archives, expected))  # not to be reused
            raise DownloadError(f"{dataset}: {err}: a corrupted, incomplete or wrong archive. "
                                f"Nothing was put in {target};{where} rerun to download it "
                                "again.") from None
        os.rename(os.path.join(staging, spec.folder), target)
        shutil.rmtree(staging)
        os.remove(lock)
        report(f"{dataset}: done: {target} checks out")
        _discard_downloads(archives.values(), downloads, dataset, options, report)
    return "downloaded"


def download_split_lists(dataset: str, data_dir: str, options: Options,
                         report: Reporter) -> str:
    """PACS_splits: PACS's twelve official split lists, plain files that go beside PACS's domain
    folders (``<data_dir>/PACS/<domain>_{train,crossval,test}_kfold.txt``, where PACS's
    ``data_split`` "official" reads them). They name PACS's images, so PACS must be there first
    (else an error before any request). Only the lists missing there are fetched (into
    ``<data_dir>/downloads/``); each is read by PACS's own list reader against the images
    (:func:`split_lists_problems`); only when every one reads are they copied to a staging folder
    and renamed into place one by one (a list in the PACS folder is always complete, and a rerun
    after a kill fetches only those still missing). A list that does not read puts nothing in
    place and is moved to ``<file>.corrupt``; a list already in the PACS folder that does not
    read is left as it is, with an error. Returns "present" or "downloaded"."""
    spec = DATASET_SPECS[dataset]
    base = spec.adds_to
    target = os.path.join(data_dir, spec.folder)
    base_status, base_detail = dataset_status(base, data_dir)
    if base_status != "ok":
        raise DownloadError(
            f"{dataset}: the lists name {base}'s images and are checked against them, but "
            f"{base_detail}: download {base} with them: "
            f"{download_command([base, dataset], data_dir)}")

    def check() -> tuple[str, str]:
        status, detail = dataset_status(dataset, data_dir)
        if status == "broken":
            raise DownloadError(
                f"{dataset}: {detail}. The lists in {target} were left as they are: move the "
                f"list that does not read away (or delete it), then rerun to download it.")
        return status, detail

    status, detail = check()
    if status == "ok":
        report(f"{dataset}: already present ({detail}); skipped")
        return "present"
    downloads = os.path.join(data_dir, DOWNLOADS_FOLDER)
    os.makedirs(downloads, exist_ok=True)
    staging = os.path.join(data_dir, f".{dataset}.download-tmp")
    lock = os.path.join(data_dir, f".{spec.folder}.download-lock")  # the one of the base
    with _lock(lock, f"{base} or {dataset}"):
        status, detail = check()  # another run may have finished meanwhile
        if status == "ok":
            report(f"{dataset}: already present ({detail}); skipped")
            return "present"
        if status == "partial":
            report(f"{dataset}: {detail}")
        if os.path.exists(staging):
            report(f"{dataset}: removing {staging}, left by an interrupted run")
            shutil.rmtree(staging)
        missing = [s for s in sources_of(dataset)
                   if not os.path.isfile(os.path.join(target, s.name))]
        expected = {s.name: expected_for(s, options.sha256) for s in missing}
        report(f"{dataset}: downloading {len(missing)} list(s) into {downloads}")
        lists = {}
        for source in missing:
            url = options.urls.get(source.name, source.url)
            lists[source.name] = obtain(source, downloads, url, expected[source.name],
                                        options.retries, report)
        problems = split_lists_problems(data_dir, lists)
        if problems:
            first = next(iter(problems.values()))
            more = (f" (and {len(problems) - 1} other list(s): "
                    f"{', '.join(list(problems)[1:])})" if len(problems) > 1 else "")
            where = _moved_note(_set_aside_unverified({n: lists[n] for n in problems}, expected))
            raise DownloadError(
                f"{dataset}: {first}{more}. Nothing was put in {target};{where} rerun to "
                f"download {'them' if len(problems) > 1 else 'it'} again.")
        os.makedirs(staging)
        for name, path in lists.items():
            shutil.copyfile(path, os.path.join(staging, name))
        for name in lists:
            os.replace(os.path.join(staging, name), os.path.join(target, name))
        shutil.rmtree(staging)
        status, detail = dataset_status(dataset, data_dir)
        if status != "ok":  # e.g. a list removed meanwhile by hand
            raise DownloadError(f"{dataset}: after putting the lists in place: {detail}; rerun")
        os.remove(lock)
        report(f"{dataset}: done: {detail}; train on them with --dataset {base} --hparams "
               "'{\"data_split\": \"official\"}'")
        _discard_downloads(lists.values(), downloads, dataset, options, report)
    return "downloaded"


def download(names: Iterable[str], data_dir: str, options: Options | None = None,
             report: Reporter | None = None) -> list[tuple[str, str]]:
    """Download every dataset of ``names`` (see :func:`resolve_names`) into ``data_dir``, in
    order, stopping at the first failure. Returns ``[(dataset, "present" | "downloaded" |
    "built in")]``. Raises :class:`UnknownDataset` for unknown dataset or file names (nothing
    is done then) and :class:`DownloadError`."""
    options = options or Options()
    report = report or Reporter()
    resolved = resolve_names(names)
    for name in [*options.urls, *options.sha256]:
        if name not in SOURCES_BY_NAME:
            close = difflib.get_close_matches(name, list(SOURCES_BY_NAME), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UnknownDataset(f"unknown file {name!r}{hint}; the files (see --list): "
                                 + ", ".join(SOURCES_BY_NAME))
    os.makedirs(data_dir, exist_ok=True)
    results = []
    for index, (name, notes) in enumerate(resolved):
        for note in notes:
            report(f"{note}.")
        if name in BUILT_IN:
            results.append((name, "built in"))
            continue
        try:
            results.append((name, download_dataset(name, data_dir, options, report)))
        except DownloadError as err:
            rest = [n for n, _ in resolved[index + 1:] if n not in BUILT_IN]
            if rest:
                raise DownloadError(f"{err} (not attempted: {', '.join(rest)})") from None
            raise
        if ALIASES["DomainNet20"][1] in notes:
            problem = domainnet20_problem(data_dir)
            if problem:
                raise DownloadError(f"DomainNet20: {problem}")
            report(f"DomainNet20: its 20 classes are in "
                   f"{os.path.join(data_dir, DATASET_SPECS['DomainNet'].folder)}")
    return results
