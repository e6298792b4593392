"""The Algorithm contract (protocol spec 2) and ERM.

An ``Algorithm`` is an ``nn.Module`` built as ``(input_shape, num_classes, num_domains, hparams)``;
``update(minibatches, unlabeled=None)`` does one optimisation step on one ``(x, y)`` batch per source
environment (its list index is the domain label) and returns a dict of Python floats;
``predict(x)`` returns ``[N, num_classes]`` logits. Every tensor a method keeps must be a parameter,
buffer or submodule so that ``.to(device)`` and ``state_dict()`` carry it; step counters are buffers.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import catalog
from dg_plugins.registry import ALGORITHMS


def register_algorithm(name: str | None = None):
    """Class decorator: add an Algorithm to the registry and to collect_results' row order."""

    def add(cls):
        key = name or cls.__name__
        catalog.declare_algorithm(key)
        ALGORITHMS.register(key, cls)
        return cls

    return add


class Algorithm(nn.Module):
    """Base class: DomainBed's contract plus :meth:`optimizers` for resumable checkpoints."""

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.num_domains = num_domains
        self.hparams = hparams

    def update(self, minibatches, unlabeled=None) -> dict:
        raise NotImplementedError

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer the algorithm holds, by attribute name (saved in resume checkpoints).
        The default finds them among the instance attributes; override for other layouts."""
        return {k: v for k, v in vars(self).items() if isinstance(v, torch.optim.Optimizer)}


def adam(params, hparams, lr: float | None = None) -> torch.optim.Adam:
    """Adam with the job's ``lr`` and ``weight_decay``, as DomainBed's algorithms build it."""
    return torch.optim.Adam(params, lr=hparams["lr"] if lr is None else lr,
                            weight_decay=hparams["weight_decay"])


@register_algorithm()
class ERM(Algorithm):
    """Empirical risk minimisation: cross-entropy on the pooled source batches."""

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        from dg_plugins import networks

        self.featurizer = networks.Featurizer(self.input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                              hparams["nonlinear_classifier"])
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.optimizer = adam(self.network.parameters(), hparams)

    def update(self, minibatches, unlabeled=None):
        x = torch.cat([xi for xi, _ in minibatches])
        y = torch.cat([yi for _, yi in minibatches])
        loss = F.cross_entropy(self.predict(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def predict(self, x):
        return self.network(x)
