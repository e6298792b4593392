"""A test-only algorithm, registered by importing this file (tests/conftest.py imports every module
of tests/plugins/, and sweep tests name it in $DG_PLUGINS_IMPORT): it proves that one file is all
a method needs to be picked up by the contract tests and by sweeps.

It keeps what real methods keep and the contract must handle: two optimizers in a dict, an LR
scheduler, a step-counter buffer, its own hparam, and a second head trained on domain labels.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams
from dg_plugins.algorithms import FeatureClassifier, register_algorithm, split_minibatches

NAME = "ToyTwoHeads"


@register_algorithm(NAME)
class ToyTwoHeads(FeatureClassifier):
    """ERM plus a domain head on detached features (its own optimizer), weighted by
    ``toy_domain_weight``; the main lr decays by 0.5 every 2 steps."""

    @staticmethod
    def hparam_space(dataset):
        return {"toy_domain_weight": (0.5, lambda r: 10 ** r.uniform(-1, 0), hparams.positive)}

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.domain_head = nn.Linear(self.featurizer.n_outputs, max(num_domains, 1))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.opts = {
            "main": torch.optim.Adam(self.network.parameters(), lr=hparams["lr"]),
            "domain": torch.optim.SGD(self.domain_head.parameters(), lr=0.1),
        }
        self.schedule = torch.optim.lr_scheduler.StepLR(self.opts["main"], step_size=2, gamma=0.5)

    def update(self, minibatches, unlabeled=None):
        x, y, domain = split_minibatches(minibatches)
        features = self.features(x)
        class_loss = F.cross_entropy(self.classifier(features), y)
        domain_loss = F.cross_entropy(self.domain_head(features.detach()), domain)
        for opt in self.opts.values():
            opt.zero_grad(set_to_none=True)
        (class_loss + self.hparams["toy_domain_weight"] * domain_loss).backward()
        for opt in self.opts.values():
            opt.step()
        self.schedule.step()
        self.steps += 1
        return {"loss": class_loss.item(), "domain_loss": domain_loss.item()}
