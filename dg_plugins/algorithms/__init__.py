"""Algorithms: one module per method; importing the package registers them all (``erm`` first,
then by name; a new file registers too). Read base, erm (the template), then a method."""

import importlib

from dg_plugins import catalog

for _module in catalog.algorithm_modules():  # registration, in the catalog's order
    importlib.import_module(f"{__name__}.{_module}")

from dg_plugins.algorithms.base import (Algorithm, FeatureClassifier, adam,  # the contract
                                        optimizer_step, register_algorithm, split_minibatches)
from dg_plugins.algorithms.erm import ERM  # the baseline and the template of a method
from dg_plugins.algorithms.dismae import MAE, DisMAE  # Zhang et al., ECCV 2024
from dg_plugins.algorithms.dmg import DMG  # Chattopadhyay et al., ECCV 2020
from dg_plugins.algorithms.gmoe import ERM_ViT, GMoE  # Li et al., ICLR 2023
from dg_plugins.algorithms.mpbm import MPBM  # Heidari & Guo, arXiv 2502.16064
from dg_plugins.algorithms.udg_finetune import FineTuner  # UDG fine-tuning after pretraining
