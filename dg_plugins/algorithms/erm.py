"""ERM: empirical risk minimisation (Vapnik, 1998), DomainBed's baseline (``ERM`` in
``domainbed/algorithms.py``). The template of a new method: copy it, then follow
``docs/methods/README.md``."""

from __future__ import annotations

import torch.nn.functional as F

from dg_plugins.algorithms.base import (FeatureClassifier, adam, optimizer_step,
                                        register_algorithm, split_minibatches)


@register_algorithm("ERM")
class ERM(FeatureClassifier):
    """Cross-entropy on the concatenated source minibatches, one Adam step per ``update``."""

    #: ERM needs nothing beyond the suite's defaults (random-init backbones, batch 8).
    TINY_TEST_HPARAMS: dict = {}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """None of its own: the base space is DomainBed's."""
        return {}

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.optimizer = adam(self.network.parameters(), hparams)

    def update(self, minibatches, unlabeled=None):
        x, y, _ = split_minibatches(minibatches)
        loss = F.cross_entropy(self.predict(x), y)
        optimizer_step(self.optimizer, loss)
        return {"loss": loss.item()}
