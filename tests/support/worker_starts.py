"""Test-only plugin: counts loader worker starts (``DG_PLUGINS_IMPORT=worker_starts`` in a job's
environment). Every loader worker a train process starts runs the loaders' ``worker_init_fn``
(:func:`dg_plugins.train.batches._ignore_stop_signals`) once; wrapped here, each start appends its
pid to the file named by ``DG_TEST_WORKER_STARTS``."""

from __future__ import annotations

import os

from dg_plugins.train import batches

STARTS = "DG_TEST_WORKER_STARTS"
_original = batches._ignore_stop_signals


def _counting(worker_id: int) -> None:
    with open(os.environ[STARTS], "a") as f:
        f.write(f"{os.getpid()}\n")
    _original(worker_id)


batches._ignore_stop_signals = _counting
