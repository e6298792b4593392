"""Digits: the single-source DG digits benchmark (ADA, M-ADA, PDEN, MPBM): MNIST -> SVHN,
MNIST-M, SYN, USPS as 32x32 RGB in [0, 1], read from local files under ``<data_dir>/digits/``
(the layouts accepted: docs/datasets.md). Not provided by the downloader."""

from __future__ import annotations

import gzip
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dg_plugins.datasets.base import MultipleDomainDataset, register_dataset
from dg_plugins.layouts import MNIST_SEARCH_FOLDERS, read_idx

FOLDER_NAME = "digits"
SIZE = 32
#: Source images taken from MNIST's training set (the benchmark's "first 10k").
MNIST_SOURCE_COUNT = 10_000
NO_DATA_DIR = ("Digits needs --data_dir: the folder holding digits/ (see "
               "dg_plugins.datasets.digits for the layout)")

#: Released-format files per domain, relative to ``<data_dir>/digits/<domain>/`` (for messages).
LAYOUT = {
    "mnist": "train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz] (MNIST IDX)",
    "svhn": "test_32x32.mat (SVHN format 2)",
    "mnist_m": "mnist_m_test_labels.txt and the PNGs it names in mnist_m_test/",
    "syn": "synth_test_32x32.mat (synthetic digits, SVHN-like .mat)",
    "usps": "zip.test or zip.test.gz (USPS, label then 256 values in [-1, 1] per line)",
}


def _first_existing(*paths: str) -> str | None:
    return next((p for p in paths if os.path.isfile(p)), None)


def to_rgb32(images: np.ndarray) -> torch.Tensor:
    """Images of any accepted shape and range as float32 ``[N, 3, 32, 32]`` in [0, 1]."""
    array = np.asarray(images)
    if array.ndim == 3:
        array = array[:, None]
    elif array.ndim == 4 and array.shape[-1] in (1, 3) and array.shape[1] not in (1, 3):
        array = array.transpose(0, 3, 1, 2)
    if array.ndim != 4 or array.shape[1] not in (1, 3):
        raise ValueError(f"digit images must be [N, H, W], [N, H, W, C] or [N, C, H, W] with 1 or "
                         f"3 channels, got shape {images.shape}")
    x = torch.from_numpy(np.ascontiguousarray(array)).float()
    if array.dtype == np.uint8:
        x = x / 255.0
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if tuple(x.shape[2:]) != (SIZE, SIZE):
        x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False,
                          antialias=True)
    return x.clamp(0.0, 1.0).contiguous()


def load_npz(path: str):
    with np.load(path) as data:
        if "x" not in data or "y" not in data:
            raise ValueError(f"{path} must hold arrays 'x' (images) and 'y' (labels 0-9); it has "
                             f"{sorted(data.files)}")
        x, y = data["x"], data["y"]
    if len(x) != len(y):
        raise ValueError(f"{path}: {len(x)} images but {len(y)} labels")
    return x, y


def load_mat(path: str):
    """SVHN-format .mat: ``X`` ``[32, 32, 3, N]`` uint8, ``y`` ``[N, 1]``."""
    try:
        from scipy.io import loadmat
    except ImportError as err:
        raise ModuleNotFoundError(
            f"reading {path} needs scipy (pip install scipy), or convert it to a .npz with "
            "arrays x and y") from err
    data = loadmat(path)
    if "X" not in data or "y" not in data:
        raise ValueError(f"{path} must hold 'X' [32, 32, 3, N] and 'y' [N, 1] (SVHN format 2)")
    return np.transpose(data["X"], (3, 0, 1, 2)), data["y"]


def _listed_files(list_file: str, image_folder: str):
    """MNIST-M release: ``list_file`` lines ``<name>.png <digit>``, images in ``image_folder``."""
    with open(list_file) as handle:
        for line in handle:
            if not (parts := line.split()):
                continue
            if len(parts) != 2:
                raise ValueError(f"{list_file}: expected '<file> <digit>' lines, got {line!r}")
            yield os.path.join(image_folder, parts[0]), parts[1]


def load_usps_zip(path: str):
    """Hastie et al.'s ``zip.test``: per line the digit then 256 values in [-1, 1] (16x16)."""
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rt") if gzipped else open(path, "r") as handle:
        rows = np.loadtxt(handle, dtype=np.float64, ndmin=2)
    if rows.shape[1] != 257:
        raise ValueError(f"{path}: expected 257 values per line (label + 16x16), got "
                         f"{rows.shape[1]}")
    images = ((rows[:, 1:] + 1.0) / 2.0).reshape(-1, 16, 16).astype(np.float32)
    return images, rows[:, 0].round()


def _digit_files(folder: str) -> list[tuple[str, int]]:
    subs = [(os.path.join(folder, str(digit)), digit) for digit in range(10)]
    return [(os.path.join(sub, name), digit) for sub, digit in subs if os.path.isdir(sub)
            for name in sorted(os.listdir(sub)) if not name.startswith(".")]


def load_images(files, size: int | None = None):
    """The RGB images (``size`` x ``size`` if given) and digits of ``(path, digit)`` files."""
    from PIL import Image

    images, labels = [], []
    for path, digit in files:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
            images.append(np.asarray(rgb.resize((size, size), Image.BILINEAR) if size else rgb))
        labels.append(int(digit))
    return np.stack(images), np.asarray(labels)


def find_domain(domain: str, data_dir: str):
    """A loader ``() -> (images, labels)`` of the domain's files in the first layout found (a
    ``.npz``, the released files, digit folders), else None."""
    root = os.path.join(data_dir, FOLDER_NAME)
    folder = os.path.join(root, domain)
    if os.path.isfile(npz := os.path.join(root, domain + ".npz")):
        return lambda: load_npz(npz)
    if domain == "mnist":
        for candidate in [folder] + [os.path.join(data_dir, sub) for sub in MNIST_SEARCH_FOLDERS]:
            images, labels = (_first_existing(*(os.path.join(candidate, f"train-{kind}-ubyte{s}")
                                                for s in ("", ".gz")))
                              for kind in ("images-idx3", "labels-idx1"))
            if images and labels:
                return lambda: (read_idx(images), read_idx(labels))
    else:
        names, load = {
            "svhn": (["test_32x32.mat"], load_mat), "syn": (["synth_test_32x32.mat"], load_mat),
            "mnist_m": (["mnist_m_test_labels.txt"], lambda path: load_images(_listed_files(
                path, os.path.join(folder, "mnist_m_test")))),
        }.get(domain, (["zip.test", "zip.test.gz"], load_usps_zip))
        if path := _first_existing(*(os.path.join(folder, name) for name in names)):
            return lambda: load(path)
    if os.path.isdir(folder) and _digit_files(folder):
        return lambda: load_images(_digit_files(folder), SIZE)
    return None


def missing_domain_message(domain: str, data_dir: str) -> str:
    from dg_plugins.download.sources import download_command

    root, command = os.path.join(data_dir, FOLDER_NAME), download_command("Digits", data_dir)
    lines = [f"  {os.path.join(root, domain + '.npz')} (arrays x, y)",
             f"  {os.path.join(root, domain)}/{LAYOUT[domain]}",
             f"  {os.path.join(root, domain)}/<digit 0-9>/<image files>"]
    if domain == "mnist":
        raw = os.path.join(data_dir, "MNIST", "raw")
        lines.insert(2, f"  or the MNIST IDX training files in {raw}/")
        lines.append("(MNIST's IDX files: on a machine with internet, "
                     f"`{download_command('MNIST', data_dir)}` writes them to {raw}/)")
    how = (f"On a machine with internet, `{command}` downloads it; or put one of these in place"
           if command else "The downloader (python -m dg_plugins.scripts.download) does not "
           "provide Digits: get the domain's files from their publishers and put one of these in "
           "place")
    return f"Digits domain {domain!r} not found under {root}. {how}:\n" + "\n".join(lines)


def load_domain(domain: str, data_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[N, 3, 32, 32]`` and labels ``[N]`` of one domain (MNIST: its first 10,000)."""
    load = find_domain(domain, data_dir)
    if load is None:
        raise FileNotFoundError(missing_domain_message(domain, data_dir))
    x, y = load()
    if domain == "mnist":
        x, y = x[:MNIST_SOURCE_COUNT], y[:MNIST_SOURCE_COUNT]
    if len(x) != len(y):
        raise ValueError(f"Digits domain {domain!r}: {len(x)} images but {len(y)} labels")
    x, labels = to_rgb32(x), torch.as_tensor(np.asarray(y).reshape(-1).astype(np.int64))
    labels = torch.where(labels == 10, torch.zeros_like(labels), labels)  # SVHN: 10 is digit 0
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"digit labels must be 0-9 (10 is read as 0), got range "
                         f"{int(labels.min())}..{int(labels.max())}")
    return x, labels


@register_dataset()
class Digits(MultipleDomainDataset):
    """MNIST (its first 10k training digits) -> SVHN, MNIST-M, SYN, USPS (docs/datasets.md)."""

    ENVIRONMENTS = ["mnist", "svhn", "mnist_m", "syn", "usps"]
    INPUT_SHAPE = (3, SIZE, SIZE)
    DEFAULT_BACKBONE = "lenet"
    IN_MEMORY = True
    N_STEPS = 10001
    CHECKPOINT_FREQ = 500
    N_WORKERS = 0

    @classmethod
    def check_data_dir(cls, data_dir: str | None) -> None:
        """Raise FileNotFoundError (the files expected, how to get them) unless all are there."""
        if not data_dir:
            raise FileNotFoundError(NO_DATA_DIR)
        missing = [d for d in cls.ENVIRONMENTS if find_domain(d, data_dir) is None]
        if missing:
            also = (f"\nAlso missing: {', '.join(map(repr, missing[1:]))} (each in one of the "
                    "same layouts, under its own name)" if len(missing) > 1 else "")
            raise FileNotFoundError(missing_domain_message(missing[0], data_dir) + also)

    def __init__(self, root, test_envs=(), hparams=None):
        if not root:
            raise FileNotFoundError(NO_DATA_DIR)
        self.datasets = [TensorDataset(*load_domain(domain, root)) for domain in self.ENVIRONMENTS]
        self.input_shape, self.num_classes = self.INPUT_SHAPE, 10
