"""Layout checks (by the dataset classes' rules, :mod:`dg_plugins.layouts`, torch-free),
extraction into a staging folder (regular files and folders only), and each dataset's
post-processing (DomainBed's ``domainbed/scripts/download.py``)."""

from __future__ import annotations

import collections
import contextlib
import gzip
import json
import os
import re
import shutil
import stat
import tarfile
import time
import zipfile
import zlib
from typing import Iterable

from dg_plugins import catalog, layouts
from dg_plugins.download.fetch import Reporter, check_free_space
from dg_plugins.download.sources import (
    CHUNK, DATASET_SPECS, EXTRACT_FACTOR, TERRA_ANNOTATION_FILES, TERRA_CATEGORIES, TERRA_LOCATIONS,
    TEST_DELAY_ENV, CorruptArchive, DatasetSpec, sources_of,
)
from dg_plugins.layouts import mnist_files_problem, visible_subfolders


def dataset_status(dataset: str, data_dir: str) -> tuple[str, str]:
    """``("ok" | "absent" | "broken", detail)`` of ``dataset`` under ``data_dir``."""
    spec = DATASET_SPECS[dataset]
    if spec.adds_to:
        return split_lists_status(dataset, data_dir)
    folder = os.path.join(data_dir, spec.folder)
    if dataset == "MNIST":
        paths = layouts.locate_mnist_files(data_dir)
        if paths is None:
            if os.path.exists(folder):
                return "broken", f"{folder} exists but does not hold the four MNIST files"
            return "absent", f"no MNIST files under {data_dir}"
        problem = mnist_files_problem(paths)
        where = os.path.dirname(paths["train_images"])
        return ("broken", problem) if problem else ("ok", f"{where} holds the four MNIST files")
    if not os.path.exists(folder):
        return "absent", f"{folder} does not exist"
    problem = image_layout_problem(dataset, data_dir)
    return ("broken", problem) if problem else ("ok", f"{folder} checks out")


def image_layout_problem(dataset: str, data_dir: str) -> str | None:
    """None when ``<data_dir>/<folder>`` (or, for MNIST, a staging folder) reads as ``dataset``,
    else what is wrong."""
    if dataset == "MNIST":
        paths = layouts.locate_mnist_files(data_dir)
        if paths is None:
            return (f"the four MNIST files ({', '.join(layouts.MNIST_FILES.values())}, each "
                    f"plain or .gz) are in none of "
                    f"{', '.join(layouts.mnist_search_folders(data_dir))}")
        return mnist_files_problem(paths)
    spec = DATASET_SPECS[dataset]
    root = os.path.join(data_dir, spec.folder)
    if not os.path.isdir(root):
        return f"{root} is not a folder"
    expected = sorted(layouts.DOMAIN_FOLDERS[dataset])
    layout = catalog.image_folder_layout(dataset)
    try:
        folders = visible_subfolders(root)
        if folders != expected:
            return f"{root} has the domain folders {folders}, expected {expected}"
        class_folders = {env: visible_subfolders(os.path.join(root, env)) for env in folders}
        for env, names in class_folders.items():
            if not names:
                return f"no class folders in domain folder {os.path.join(root, env)}. {layout}."
        classes = sorted(set().union(*class_folders.values()))
        for env in folders:
            path = os.path.join(root, env)
            if not layouts.image_samples(path, classes):
                return f"no image files in the class folders of {path}. {layout}."
    except OSError as err:
        return str(err)
    if spec.num_classes is not None and len(classes) != spec.num_classes:
        return f"{root} has {len(classes)} classes, the standard {dataset} has {spec.num_classes}"
    return None


def split_lists_problems(data_dir: str, lists: dict[str, str]) -> dict[str, str]:
    """``{file name: what is wrong}`` for PACS's split lists, each read as PACS reads it."""
    root = os.path.join(data_dir, DATASET_SPECS["PACS"].folder)
    domains = visible_subfolders(root)
    classes = sorted(set().union(*(visible_subfolders(os.path.join(root, d)) for d in domains)))
    domain_of = {layouts.pacs_split_file(d, kind): d
                 for d in domains for kind in layouts.PACS_SPLIT_KINDS}
    samples: dict[str, list] = {}
    problems = {}
    for name, path in lists.items():
        if name not in domain_of:
            problems[name] = f"{name} is not the list of a domain of {root}"
            continue
        domain = domain_of[name]
        env_root = os.path.join(root, domain)
        if domain not in samples:
            samples[domain] = layouts.image_samples(env_root, classes)
        try:
            layouts.match_split_list(path, domain, env_root, samples[domain], classes)
        except (ValueError, OSError) as err:  # OfficialSplitError, UnicodeDecodeError, ...
            problems[name] = str(err)
    return problems


def split_lists_status(dataset: str, data_dir: str) -> tuple[str, str]:
    """``("ok" | "absent" | "partial" | "broken", detail)`` of PACS_splits' lists ("absent" too
    while PACS does not check out)."""
    base_status, base_detail = dataset_status(DATASET_SPECS[dataset].adds_to, data_dir)
    if base_status != "ok":
        return "absent", base_detail
    folder = os.path.join(data_dir, DATASET_SPECS[dataset].folder)
    names = [source.name for source in sources_of(dataset)]
    present = {n: os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))}
    if not present:
        return "absent", f"none of the {len(names)} lists is in {folder}"
    if problems := split_lists_problems(data_dir, present):
        first, *others = problems.values()
        return "broken", first + (f" (and {len(others)} other list(s))" if others else "")
    if missing := [n for n in names if n not in present]:
        return "partial", (f"{len(missing)} of the {len(names)} lists missing in {folder}: "
                           f"{', '.join(missing)}")
    return "ok", f"the {len(names)} lists in {folder} name its images"


def domainnet20_problem(data_dir: str) -> str | None:
    """None when every DomainNet domain folder holds DomainNet-20's classes, else what lacks."""
    root = os.path.join(data_dir, DATASET_SPECS["DomainNet"].folder)
    for env in visible_subfolders(root):
        present = set(visible_subfolders(os.path.join(root, env)))
        if missing := [c for c in layouts.DOMAINNET20_CLASSES if c not in present]:
            return f"DomainNet-20 class folder(s) {missing} missing in {os.path.join(root, env)}"
    return None


def _test_delay() -> None:
    if delay := os.environ.get(TEST_DELAY_ENV):
        time.sleep(float(delay))


def _member_parts(name: str) -> list[str] | None:
    """The path parts of archive member ``name``, or None when it points outside the folder."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return None
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return None if ".." in parts else parts


def _member_kind(member) -> str:
    """"file", "dir", or what else a tar member or a zip entry (by its Unix mode) is, in words."""
    if isinstance(member, tarfile.TarInfo):
        kinds = (("dir", member.isdir()), ("file", member.isfile()),
                 ("a symbolic link", member.issym()), ("a hard link", member.islnk()),
                 ("a device file", member.ischr() or member.isblk()),
                 ("a named pipe", member.isfifo()))
    else:
        mode = member.external_attr >> 16
        kinds = (("dir", member.is_dir()),
                 ("file", member.create_system != 3 or stat.S_IFMT(mode) in (0, stat.S_IFREG)),
                 ("dir", stat.S_ISDIR(mode)), ("a symbolic link", stat.S_ISLNK(mode)),
                 ("a device file", stat.S_ISCHR(mode) or stat.S_ISBLK(mode)),
                 ("a named pipe", stat.S_ISFIFO(mode)))
    return next((kind for kind, true in kinds if true), "a special file")


def block_size(folder: str) -> int:
    with contextlib.suppress(AttributeError, OSError):  # no statvfs on Windows
        return os.statvfs(folder).f_frsize or 4096
    return 4096


def extraction_size(path: str, block: int = 4096) -> int:
    """Bytes the archive takes once extracted in ``block``-byte blocks (exact for zip files)."""
    if not zipfile.is_zipfile(path):
        return int(os.path.getsize(path) * EXTRACT_FACTOR)
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    folders = {os.path.dirname(info.filename.rstrip("/")) for info in infos}
    files = sum(-(-info.file_size // block) * block for info in infos if not info.is_dir())
    return files + block * len(folders)


def extract(path: str, dest: str, report: Reporter) -> None:
    """Extract a zip or tar archive's regular files and folders into ``dest`` (the rest dropped
    and named); :class:`CorruptArchive` when it does not."""
    name = os.path.basename(path)
    check_free_space(dest, extraction_size(path, block_size(dest)), f"extracting {name}")
    report(f"  extracting {name} into {dest}")
    count = 0
    dropped: list[str] = []
    try:
        with open(path, "rb") as handle:
            is_zip = handle.read(2) == b"PK"
        with zipfile.ZipFile(path) if is_zip else tarfile.open(path, "r:*") as archive:
            for member in archive.infolist() if is_zip else archive:
                member_name = member.filename if is_zip else member.name
                kind, parts = _member_kind(member), _member_parts(member_name)
                if parts is None or kind not in ("file", "dir"):
                    why = "a path outside the archive's folder" if kind in ("file", "dir") else kind
                    dropped.append(f"{member_name!r} ({why})")
                    continue
                target = os.path.join(dest, *parts)
                if kind == "dir":
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                opened = archive.open(member) if is_zip else archive.extractfile(member)
                with opened as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                count += 1
                _test_delay()
    except EOFError as err:
        raise CorruptArchive(f"{name} ends early (a truncated file: {err})") from None
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, gzip.BadGzipFile,
            NotImplementedError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CorruptArchive(f"{name} does not extract: {type(err).__name__}: {first}") from None
    if dropped:
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        report(f"  {name}: dropped {len(dropped)} unsafe member(s) (links, devices and paths "
               f"outside the archive are never extracted): {', '.join(dropped[:5])}{more}")
    if count == 0:
        raise CorruptArchive(f"{name} holds no files")
    report(f"  extracted {count} files of {name}")


def find_root(extracted: str, expected_name: str | None, env_folders: Iterable[str]) -> str:
    """The folder holding the domain folders: ``expected_name``, else the one (at most 3 levels
    down) holding all ``env_folders``."""
    wanted = set(env_folders)
    if expected_name:
        candidate = os.path.join(extracted, expected_name)
        if os.path.isdir(candidate) and wanted <= set(os.listdir(candidate)):
            return candidate
    found = []
    for folder, dirnames, _ in os.walk(extracted):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__MACOSX"))]
        if wanted <= set(dirnames):
            found.append(folder)
        if os.path.relpath(folder, extracted).count(os.sep) >= 2:
            dirnames[:] = []
    if len(found) != 1:
        raise CorruptArchive(
            f"the archive does not hold one folder with the domain folders "
            f"{sorted(wanted)} ({'found ' + ', '.join(found) if found else 'none found'})")
    return found[0]


def prepare_single_archive(spec: DatasetSpec, archives: dict[str, str], staging: str,
                           report: Reporter) -> None:
    """PACS, VLCS, OfficeHome: extract, move the domain folders' folder in place."""
    (path,) = archives.values()
    extracted = os.path.join(staging, "extracted")
    os.makedirs(extracted)
    extract(path, extracted, report)
    root = find_root(extracted, spec.archive_root, layouts.DOMAIN_FOLDERS[spec.name])
    os.rename(root, os.path.join(staging, spec.folder))
    if root != extracted:
        shutil.rmtree(extracted)


def prepare_domain_net(spec: DatasetSpec, archives: dict[str, str], staging: str,
                       report: Reporter) -> None:
    """The six domain zips into ``<staging>/domain_net/``, DomainBed's duplicates deleted."""
    target = os.path.join(staging, spec.folder)
    os.makedirs(target)
    for name, path in archives.items():
        if name.endswith(".zip"):
            extract(path, target, report)
    with open(archives["domain_net_duplicates.txt"], encoding="utf-8") as handle:
        listed = [line.strip() for line in handle if line.strip()]
    removed = 0
    for relative in listed:
        if _member_parts(relative) is None:
            raise CorruptArchive(f"domain_net_duplicates.txt lists an unsafe path {relative!r}")
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(target, relative))
            removed += 1
    report(f"  removed {removed} duplicate files of the {len(listed)} that "
           "domain_net_duplicates.txt lists")


def terra_targets(path: str) -> dict[str, set[tuple[str, str]]]:
    """Image file -> its ``(location_<id>, category)`` folders (``download_terra_incognita``), by
    the five annotation files of the tarball at ``path``, merged key by key (as DomainBed does)."""
    annotations: dict[str, list] = {}
    found = set()
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                base = os.path.basename(member.name)
                if member.isfile() and base in TERRA_ANNOTATION_FILES:
                    with archive.extractfile(member) as handle:
                        for key, values in json.load(handle).items():
                            annotations.setdefault(key, []).extend(values)
                    found.add(base)
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as err:
        raise CorruptArchive(f"{os.path.basename(path)} does not extract: "
                             f"{type(err).__name__}: {err}") from None
    if missing := sorted(set(TERRA_ANNOTATION_FILES) - found):
        raise CorruptArchive(f"{os.path.basename(path)} lacks {', '.join(missing)}")
    categories = {item["id"]: item["name"] for item in annotations.get("categories", [])}
    images = {image["id"]: (image["file_name"], f"location_{image['location']}")
              for image in annotations.get("images", [])
              if str(image["location"]) in TERRA_LOCATIONS}
    targets: dict[str, set[tuple[str, str]]] = {}
    for annotation in annotations.get("annotations", []):
        entry = images.get(annotation["image_id"])
        category = categories.get(annotation["category_id"])
        if entry is not None and category in TERRA_CATEGORIES:
            targets.setdefault(entry[0].replace("\\", "/"), set()).add((entry[1], category))
    return targets


def prepare_terra_incognita(spec: DatasetSpec, archives: dict[str, str], staging: str,
                            report: Reporter) -> None:
    """Stream the tarball once, each kept image to its ``location_<id>/<category>/`` folders."""
    targets = terra_targets(archives["eccv_18_annotations.tar.gz"])
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
    counts = collections.Counter()
    try:
        with tarfile.open(images_path, "r:*") as archive:
            for member in archive:
                relative = member.name.replace("\\", "/").split("/", 1)[-1]
                if not member.isfile() or relative not in targets or relative in written:
                    continue
                for k, (location, category) in enumerate(sorted(targets[relative])):
                    folder = os.path.join(target, location, category)
                    os.makedirs(folder, exist_ok=True)
                    dest = os.path.join(folder, os.path.basename(relative))
                    if k == 0:
                        with archive.extractfile(member) as src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out, CHUNK)
                        first = dest
                    else:
                        try:
                            os.link(first, dest)
                        except OSError:
                            shutil.copyfile(first, dest)
                    counts[location] += 1
                written.add(relative)
                _test_delay()
    except (tarfile.TarError, EOFError, zlib.error) as err:
        raise CorruptArchive(f"{os.path.basename(images_path)} does not extract: "
                             f"{type(err).__name__}: {err}") from None
    if missing := sorted(set(targets) - written):
        raise CorruptArchive(
            f"{len(missing)} annotated images are missing from "
            f"{os.path.basename(images_path)} (e.g. {missing[0]})")
    report("  images per location: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def prepare_mnist(spec: DatasetSpec, archives: dict[str, str], staging: str,
                  report: Reporter) -> None:
    """The four IDX files, gzipped and decompressed, in ``<staging>/MNIST/raw/``."""
    raw = os.path.join(staging, spec.folder, "raw")
    os.makedirs(raw)
    for name, path in archives.items():
        shutil.copyfile(path, os.path.join(raw, name))
        plain = os.path.join(raw, name[:-len(".gz")])
        try:
            with gzip.open(path, "rb") as src, open(plain, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise CorruptArchive(f"{name} does not decompress: {type(err).__name__}: "
                                 f"{err}") from None
        _test_delay()
    report(f"  wrote the four MNIST files (gzipped and decompressed) to {raw}")


PREPARE = {**dict.fromkeys(("PACS", "VLCS", "OfficeHome"), prepare_single_archive),
           "DomainNet": prepare_domain_net, "TerraIncognita": prepare_terra_incognita,
           "MNIST": prepare_mnist}

