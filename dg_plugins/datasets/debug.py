"""Debug28 / Debug224: DomainBed's fake datasets (``domainbed/datasets.py``), for tests."""

import torch
from torch.utils.data import TensorDataset

from dg_plugins.datasets.base import MultipleDomainDataset, register_dataset


class _Debug(MultipleDomainDataset):
    """3 environments of 16 ``randn`` images, labels in {0, 1}, from the global torch RNG."""

    ENVIRONMENTS = ["0", "1", "2"]
    IN_MEMORY = True
    N_WORKERS = 0  # tensors in memory: no loader processes (also under DomainBed's own train)
    SAMPLES_PER_ENV = 16

    def __init__(self, root=None, test_envs=(), hparams=None):
        self.input_shape, self.num_classes = tuple(self.INPUT_SHAPE), 2
        self.datasets = [TensorDataset(torch.randn(self.SAMPLES_PER_ENV, *self.INPUT_SHAPE),
                                       torch.randint(0, 2, (self.SAMPLES_PER_ENV,)))
                         for _ in self.ENVIRONMENTS]


@register_dataset()
class Debug28(_Debug):
    INPUT_SHAPE = (3, 28, 28)


@register_dataset()
class Debug224(_Debug):
    INPUT_SHAPE = (3, 224, 224)
