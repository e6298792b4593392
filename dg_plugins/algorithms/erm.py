"""ERM: empirical risk minimisation (Vapnik, 1998), DomainBed's baseline (``ERM`` in
``domainbed/algorithms.py``): cross-entropy on the pooled batches of all source environments.

This file is the template for a new method. To add one, copy it to ``dg_plugins/algorithms/<name>.py``
(the module is found and imported automatically; nothing else needs an edit), then:

1. rename the class and its ``@register_algorithm("Name")`` (DomainBed-style name);
2. say in the class docstring which paper it implements and which equation each loss term is;
3. declare the method's own hparams in ``hparam_space(dataset)``: ``{name: (default, random_fn[,
   check])}`` with prefixed names, DomainBed-style random ranges for sweeps and, where a value has
   a valid range, a check from :mod:`dg_plugins.hparams` (``positive``, ``probability``, ...);
4. set ``TINY_TEST_HPARAMS`` so that the method runs in a second on a CPU (tiny backbone, few inner
   steps) and, if some trainable parameter legitimately gets no gradient in a few updates,
   ``GRADIENT_EXEMPT`` with the reason;
5. keep every tensor in a parameter, buffer or submodule (counters as buffers), build optimizers
   over the algorithm's own parameters (each trainable parameter in exactly one), return the same
   update keys at every call;
6. add ``tests/algorithms/test_<name>.py`` with tests of the method's mechanism (as
   ``tests/algorithms/test_erm.py`` does for ERM). The shared contract tests
   (``tests/algorithms/test_all_algorithms.py``) pick the new class up from the registry.
"""

from __future__ import annotations

import torch.nn.functional as F

from dg_plugins.algorithms.base import (FeatureClassifier, adam, optimizer_step,
                                        register_algorithm, split_minibatches)


@register_algorithm("ERM")
class ERM(FeatureClassifier):
    """Empirical risk minimisation: ``min E_(x,y) CE(classifier(featurizer(x)), y)`` over the
    concatenation of the source minibatches, one Adam step per ``update`` (DomainBed's ERM)."""

    #: ERM needs nothing beyond the suite's defaults (random-init backbones, batch 8).
    TINY_TEST_HPARAMS: dict = {}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """ERM has no hparams of its own: the base space (lr, batch_size, weight_decay, backbone
        options) is DomainBed's."""
        return {}

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.optimizer = adam(self.network.parameters(), hparams)

    def update(self, minibatches, unlabeled=None):
        x, y, _ = split_minibatches(minibatches)
        loss = F.cross_entropy(self.predict(x), y)
        optimizer_step(self.optimizer, loss)
        return {"loss": loss.item()}
