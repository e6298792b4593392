"""The MultipleDomainDataset contract (DomainBed's ``domainbed/datasets.py``) and dataset
registration."""

from __future__ import annotations

from dg_plugins import catalog
from dg_plugins.registry import DATASETS


class MultipleDomainDataset:
    """A list of per-environment torch datasets yielding ``(x_tensor, int_label)``, with
    DomainBed's class attributes and our ``DEFAULT_BACKBONE`` (docs/datasets.md)."""

    N_STEPS = 5001
    CHECKPOINT_FREQ = 100
    N_WORKERS = 8
    ENVIRONMENTS: list[str] | None = None
    INPUT_SHAPE: tuple | None = None
    DEFAULT_BACKBONE: str | None = None
    #: True when every environment is an in-memory tensor dataset (loaded in-process, no workers).
    IN_MEMORY = False

    datasets: list
    input_shape: tuple
    num_classes: int

    def __getitem__(self, index):
        return self.datasets[index]

    def __len__(self) -> int:
        return len(self.datasets)


def register_dataset(name: str | None = None):

    def add(cls):
        key = name or cls.__name__
        if not cls.ENVIRONMENTS:
            raise ValueError(f"dataset {key!r} must define ENVIRONMENTS")
        catalog.declare_dataset(key, cls.ENVIRONMENTS, cls.DEFAULT_BACKBONE)
        DATASETS.register(key, cls)
        return cls

    return add


def num_environments(name: str) -> int:
    environments = DATASETS.get(name).ENVIRONMENTS
    if not environments:  # e.g. the generic ImageFolder, whose domains are found at construction
        raise ValueError(f"dataset {name!r} has no fixed ENVIRONMENTS (they are discovered from "
                         "the data when it is built)")
    return len(environments)
