"""What the datasets look like on disk, without torch, so that the downloader checks a folder by
the rules the dataset classes read it with: domain folders, images in ImageFolder's order, PACS's
official split lists, the MNIST IDX files."""

from __future__ import annotations

import gzip
import math
import os
import struct

#: File extensions read as images (case-insensitive) by dg_plugins' image-folder datasets.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff"}
)

#: The domain folders of each image-folder benchmark's release, sorted (DomainBed's).
DOMAIN_FOLDERS: dict[str, tuple[str, ...]] = {
    "VLCS": ("Caltech101", "LabelMe", "SUN09", "VOC2007"),
    "PACS": ("art_painting", "cartoon", "photo", "sketch"),
    "OfficeHome": ("Art", "Clipart", "Product", "Real World"),
    "TerraIncognita": ("location_100", "location_38", "location_43", "location_46"),
    "DomainNet": ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
}

#: DomainNet-20's classes (DomainNet class-folder names, sorted): the 20-class subset of the UDG
#: protocol, as the DisMAE release's ``dataset/split.sh`` lists them.
DOMAINNET20_CLASSES = sorted([
    "The_Eiffel_Tower", "bee", "bird", "blueberry", "broccoli", "fish", "flower", "giraffe",
    "grass", "hamburger", "hexagon", "horse", "sun", "tiger", "toaster", "tornado", "train",
    "violin", "watermelon", "zigzag",
])


def visible_subfolders(folder: str) -> list[str]:
    """Sorted subdirectory names of ``folder``, hidden ones excluded."""
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))


def is_image_file(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def list_images(folder: str) -> list[str]:
    """``folder``'s image files (recursive, links followed, no hidden), in ImageFolder's order."""
    found = []
    for dirpath, dirnames, filenames in sorted(os.walk(folder, followlinks=True)):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if is_image_file(f))
    return found


def has_image(folder: str) -> bool:
    """Whether ``folder`` holds an image file at any depth (hidden skipped)."""
    for _, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if any(is_image_file(f) for f in filenames):
            return True
    return False


def domain_folder_error(dataset: str, root: str, folders: list[str]) -> str | None:
    """The message for a ``--data_dir`` one level below an image tree (``root`` is one domain's
    folder), naming the folder above; else None."""
    paths = [os.path.join(root, name) for name in folders]
    if not paths or any(visible_subfolders(path) for path in paths) or not any(
            is_image_file(name) for path in paths for name in os.listdir(path)):
        return None
    here = os.path.abspath(root)
    parent = os.path.dirname(here)
    siblings = [os.path.join(parent, name) for name in visible_subfolders(parent)
                if os.path.join(parent, name) != here]
    if not any(set(visible_subfolders(sibling)) & set(folders) for sibling in siblings):
        return None  # e.g. a tree without class folders: not one level off
    tree = os.path.dirname(os.path.normpath(root)) if os.path.isabs(root) else \
        os.path.relpath(os.path.join(root, os.pardir))
    shown = ", ".join(folders[:8]) + (", ..." if len(folders) > 8 else "")
    return (f"{dataset}: the folders of {root} ({shown}) hold images, not class folders: {root} "
            f"is one domain's folder and the image tree is one level up; did you mean "
            f"--data_dir {tree}?")


def inside_dataset_folder(dataset: str, data_dir: str, folder: str) -> str | None:
    """The message for a ``--data_dir`` that is the dataset's own folder (``TREE/PACS``) or a
    folder in it, naming the folder meant; None otherwise."""
    here = os.path.abspath(data_dir)
    for tree in (here, os.path.dirname(here)):
        if os.path.basename(tree) == folder and os.path.isdir(tree):
            meant = os.path.dirname(tree)
            meant = meant if os.path.isabs(data_dir) else os.path.relpath(meant)
            where = "" if tree == here else f"a folder in {tree}, "
            return (f"{dataset}: --data_dir {data_dir} is {where}{dataset}'s own folder, not the "
                    f"one holding it ({os.path.join('<data_dir>', folder)}); did you mean "
                    f"--data_dir {meant}?")
    return None


def image_samples(env_root: str, classes: list[str]) -> list[tuple[str, int]]:
    """``(path, label)`` of every image of one domain folder, in ImageFolder's order."""
    index = {name: i for i, name in enumerate(classes)}
    return [(path, index[name]) for name in visible_subfolders(env_root)
            for path in list_images(os.path.join(env_root, name))]


def relative_paths(env_root: str, paths) -> list[str]:
    """``paths`` relative to the dataset folder above ``env_root``, with forward slashes."""
    parent = os.path.dirname(os.path.normpath(env_root))
    return [os.path.relpath(path, parent).replace(os.sep, "/") for path in paths]


#: PACS's official split lists: the PACS authors' Google Drive folder, subfolder ``pacs_label``.
PACS_SPLITS_URL = "https://drive.google.com/drive/folders/0B6x7gtvErXgfUU1WcGY5SzdwZVk"
PACS_SPLIT_KINDS = ("train", "crossval", "test")


def pacs_split_file(domain: str, kind: str) -> str:
    """The file name of one official list: ``<domain folder>_<kind>_kfold.txt``."""
    return f"{domain}_{kind}_kfold.txt"


class OfficialSplitError(FileNotFoundError, ValueError):
    """PACS's official split lists are missing or do not match the images."""


def match_split_list(list_path: str, domain: str, env_root: str,
                     samples: list[tuple[str, int]], classes: list[str]) -> list[int]:
    """Indices into ``samples`` of the images ``list_path`` names, in line order (lines
    ``<domain>/<class>/<file> <label>``, labels from 1); raises :class:`OfficialSplitError`."""
    index_of = {rel: i for i, rel in enumerate(relative_paths(env_root, [p for p, _ in samples]))}
    indices, unmatched, wrong_class = [], [], []
    with open(list_path, encoding="utf-8") as handle:
        lines = [(n, line.split()) for n, line in enumerate(handle, 1) if line.strip()]
    for number, fields in lines:
        parts = [p for p in fields[0].replace("\\", "/").split("/") if p not in ("", ".")]
        if domain in parts:
            parts = parts[parts.index(domain):]
        if (index := index_of.get("/".join(parts))) is None:
            unmatched.append(f"line {number}: {fields[0]}")
            continue
        if len(fields) > 1:
            expected = samples[index][1] + 1
            if fields[1] != str(expected):
                wrong_class.append(f"line {number}: {fields[0]} has label {fields[1]}, its "
                                   f"class folder {classes[expected - 1]!r} is {expected}")
        indices.append(index)
    if problems := unmatched or wrong_class:
        what = "name no image of" if unmatched else "disagree with the class folders of"
        raise OfficialSplitError(
            f"{len(problems)} of the {len(lines)} lines of {list_path} {what} {env_root} (e.g. "
            f"{'; '.join(problems[:3])}). The lists and the images must come from the same PACS "
            f"release (lines '<domain>/<class>/<file> <label>', labels 1-{len(classes)} in the "
            f"class order {', '.join(classes)})")
    if not indices:
        raise OfficialSplitError(f"{list_path} lists no image")
    return indices


#: The four MNIST IDX files, by role (each may also be gzipped, with a ``.gz`` suffix).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
#: Folders searched for the IDX files, in order (the downloader's and torchvision's).
MNIST_SEARCH_FOLDERS = (os.path.join("MNIST", "raw"), "raw", "")

# IDX type byte -> numpy dtype (IDX stores multi-byte values big-endian).
_IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def mnist_search_folders(root: str | None) -> list[str]:
    """The folders :func:`locate_mnist_files` looks in, in order."""
    return [os.path.join(root, sub) for sub in MNIST_SEARCH_FOLDERS] if root else []


def locate_mnist_files(root: str | None) -> dict[str, str] | None:
    """The four MNIST files by role, from the first folder with all (plain before .gz), or None."""
    for folder in mnist_search_folders(root):
        found = {role: next((path for path in (os.path.join(folder, name + suffix)
                                               for suffix in ("", ".gz")) if os.path.isfile(path)),
                            None) for role, name in MNIST_FILES.items()}
        if all(found.values()):
            return found
    return None


def read_idx(path: str):
    """One IDX file (gzipped or plain) as a native-endian numpy array of its declared shape."""
    import numpy as np

    with open(path, "rb") as handle:
        data = handle.read()
    if data[:2] == _GZIP_MAGIC:
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {data[:4].hex()})")
    ndim = data[3]
    header_size = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header_size])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    count = math.prod(shape)
    if len(data) != header_size + count * dtype.itemsize:
        raise ValueError(f"{path}: the header declares shape {shape} ({count * dtype.itemsize} "
                         f"data bytes) but the file holds {len(data) - header_size} data bytes "
                         "(truncated download?)")
    values = np.frombuffer(data, dtype=dtype, count=count, offset=header_size)
    return values.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def mnist_files_problem(paths: dict[str, str]) -> str | None:
    """What is wrong with the four IDX files ``paths`` (28x28 images, as many labels), or None."""
    try:
        for split in ("train", "test"):
            images = read_idx(paths[f"{split}_images"])
            labels = read_idx(paths[f"{split}_labels"])
            if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
                return (f"MNIST {split} files disagree: images {images.shape}, labels "
                        f"{labels.shape} ({paths[f'{split}_images']})")
    except (ValueError, OSError, EOFError) as err:
        return str(err)
    return None
