"""Datasets: importing this package registers every built-in dataset (no torchvision import:
image transforms load lazily when an image dataset is built)."""

from dg_plugins.datasets.base import MultipleDomainDataset, num_environments, register_dataset
from dg_plugins.datasets import debug  # noqa: F401  (registers Debug28, Debug224)
from dg_plugins.datasets import mnist  # noqa: F401  (ColoredMNIST, RotatedMNIST, RotatedMNIST5k)
from dg_plugins.datasets import image_folder  # noqa: F401  (VLCS ... DomainNet, ImageFolder)
from dg_plugins.datasets.image_folder import (
    ImageFolderEnvironment, MultipleEnvironmentImageFolder, make_image_folder_dataset,
)

__all__ = [
    "MultipleDomainDataset", "num_environments", "register_dataset",
    "ImageFolderEnvironment", "MultipleEnvironmentImageFolder", "make_image_folder_dataset",
]
