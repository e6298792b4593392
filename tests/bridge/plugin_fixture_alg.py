"""Test-only plugins, registered through dg_plugins' registries on import: ``BridgeTestAlg``.

It keeps an extra submodule, a step-counter buffer and its own optimizer, and declares an hparam
that DomainBed's registry lacks (``bridge_test_scale``), so the bridge tests can see that our
hparams reach DomainBed's train and that every piece follows ``.to()``. Sweep jobs import it via
``DG_PLUGINS_IMPORT=plugin_fixture_alg`` (this folder on PYTHONPATH). ``BridgeTestData`` is a
test-only in-memory dataset under a name DomainBed lacks (sweep jobs on it start no loader
processes, so they are quick).
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams
from dg_plugins.datasets.debug import Debug28
from dg_plugins.registry import ALGORITHMS, DATASETS

NAME = "BridgeTestAlg"


class BridgeTestAlg(nn.Module):
    """Linear classifier on flattened inputs plus a domain head whose loss is scaled by
    ``bridge_test_scale``."""

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__()
        self.hparams = hparams
        width = int(np.prod(input_shape))
        self.classifier = nn.Linear(width, num_classes)
        self.domain_head = nn.Linear(width, num_domains)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.optimizer = torch.optim.Adam(self.parameters(), lr=hparams["lr"],
                                          weight_decay=hparams["weight_decay"])

    def update(self, minibatches, unlabeled=None):
        x = torch.cat([xi for xi, _ in minibatches]).flatten(1)
        y = torch.cat([yi for _, yi in minibatches])
        d = torch.cat([torch.full_like(yi, i) for i, (_, yi) in enumerate(minibatches)])
        class_loss = F.cross_entropy(self.classifier(x), y)
        domain_loss = F.cross_entropy(self.domain_head(x), d)
        loss = class_loss + self.hparams["bridge_test_scale"] * domain_loss
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return {"loss": class_loss.item(), "domain_loss": domain_loss.item()}

    def predict(self, x):
        return self.classifier(x.flatten(1))


def _space(dataset):
    return {"bridge_test_scale": (0.1, lambda r: float(10 ** r.uniform(-2, 0)))}


DATASET_NAME = "BridgeTestData"


class BridgeTestData(Debug28):
    """Debug28's fake data (3 environments of 16 random 3x28x28 images, 2 classes) under a name
    DomainBed lacks, held in memory."""


def register() -> None:
    """Register both (idempotent); done on import."""
    if NAME not in ALGORITHMS:
        ALGORITHMS.register(NAME, BridgeTestAlg)
    if not hparams.has_algorithm_space(NAME):
        hparams.algorithm_hparams(NAME)(_space)
    if DATASET_NAME not in DATASETS:
        DATASETS.register(DATASET_NAME, BridgeTestData)


def unregister() -> None:
    """Remove both from dg_plugins' registries (the hparam space stays; it is unused then)."""
    ALGORITHMS.unregister(NAME)
    DATASETS.unregister(DATASET_NAME)


register()
