"""Datasets: importing this package registers every module's datasets, in name order (a new file
registers too); no torchvision import until an image dataset is built. Read base, then a dataset
(docs/datasets.md); decoded (the image cache) and device_augment are used as modules."""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)
                      if m.name != "base" and not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_module}")

from dg_plugins.datasets.base import (MultipleDomainDataset, num_environments,  # the contract
                                      register_dataset)
from dg_plugins.datasets.debug import Debug28, Debug224  # DomainBed's random test datasets
from dg_plugins.datasets.digits import Digits  # single-source digits, from local files
from dg_plugins.datasets.digits_offline import DigitsOffline  # the same, generated offline
from dg_plugins.datasets.domainnet20 import DomainNet20  # the UDG protocol's 20 classes
from dg_plugins.datasets.image_folder import (ImageFolderEnvironment,  # DomainBed's image folders
                                              MultipleEnvironmentImageFolder,
                                              make_image_folder_dataset)
from dg_plugins.datasets.mnist import ColoredMNIST, RotatedMNIST, RotatedMNIST5k  # MNIST
from dg_plugins.datasets.check import check_files, run_check  # check_data: unreadable images
