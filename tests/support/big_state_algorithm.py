"""Test-only plugin of the train and sweep tests (imported by name in child processes through PYTHONPATH):
``CrashingData`` (Debug28 whose items raise a non-user error, to check that a crash prints its
traceback once and that a sweep reports failed jobs)."""

import torch

from dg_plugins.datasets.debug import Debug28
from dg_plugins.registry import DATASETS


class _Exploding(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        raise RuntimeError(f"decoder exploded on item {index}")


class CrashingData(Debug28):
    IN_MEMORY = False
    N_WORKERS = 0

    def __init__(self, root=None, test_envs=(), hparams=None):
        super().__init__(root, test_envs, hparams)
        self.datasets = [_Exploding() for _ in self.ENVIRONMENTS]


if "CrashingData" not in DATASETS:
    DATASETS.register("CrashingData", CrashingData)
