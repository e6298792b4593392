"""Test-only plugins for tests/engine/test_train_hardening.py (imported by name in child
processes through PYTHONPATH): ``BigStateERM`` (ERM with a 64 MB buffer, so that writing its
checkpoint takes long enough to be killed in the middle) and ``CrashingData`` (Debug28 whose items
raise a non-user error, to check that a crash prints its traceback once)."""

import torch

from dg_plugins.algorithms import ERM
from dg_plugins.datasets.debug import Debug28
from dg_plugins.registry import ALGORITHMS, DATASETS


class BigStateERM(ERM):
    BYTES = 2**26

    def __init__(self, *args):
        super().__init__(*args)
        self.register_buffer("ballast", torch.randn(self.BYTES // 4))


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


if "BigStateERM" not in ALGORITHMS:
    ALGORITHMS.register("BigStateERM", BigStateERM)
if "CrashingData" not in DATASETS:
    DATASETS.register("CrashingData", CrashingData)
