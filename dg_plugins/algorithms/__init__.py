"""Algorithms: importing this package registers every built-in algorithm.

Each module of this package (``erm`` first, then the others by name; ``base`` and private ``_*``
modules excluded) is imported here, and its ``@register_algorithm`` classes register themselves:
adding a method is adding one file (copy ``erm.py``). Plugins outside the package register the
same way when imported (see :mod:`dg_plugins.plugins`).
"""

import importlib

from dg_plugins import catalog
from dg_plugins.algorithms.base import (Algorithm, FeatureClassifier, adam, optimizer_step,
                                        register_algorithm, split_minibatches)

for _module in catalog.algorithm_modules():
    importlib.import_module(f"{__name__}.{_module}")

from dg_plugins.algorithms.erm import ERM  # noqa: E402

__all__ = ["Algorithm", "ERM", "FeatureClassifier", "adam", "optimizer_step",
           "register_algorithm", "split_minibatches"]
