"""Datasets: importing this package registers every built-in dataset (no torchvision import:
image transforms load lazily when an image dataset is built)."""

from dg_plugins.datasets.base import MultipleDomainDataset, num_environments, register_dataset
from dg_plugins.datasets import debug  # noqa: F401  (registers Debug28, Debug224)

__all__ = ["MultipleDomainDataset", "num_environments", "register_dataset"]
