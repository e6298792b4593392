"""Datasets: importing this package registers every built-in dataset (no torchvision import:
image transforms load lazily when an image dataset is built).

Every module of this package (``base`` and private ``_*`` modules excluded) is imported here, in
name order, and its ``@register_dataset`` classes register themselves: adding a dataset is adding
one file.
"""

import importlib
import pkgutil

from dg_plugins.datasets.base import MultipleDomainDataset, num_environments, register_dataset

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)
                      if m.name != "base" and not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_module}")

from dg_plugins.datasets.image_folder import (  # noqa: E402
    ImageFolderEnvironment, MultipleEnvironmentImageFolder, make_image_folder_dataset,
)

__all__ = [
    "MultipleDomainDataset", "num_environments", "register_dataset",
    "ImageFolderEnvironment", "MultipleEnvironmentImageFolder", "make_image_folder_dataset",
]
