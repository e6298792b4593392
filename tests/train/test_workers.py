"""A job's loader workers come from the cores it was given (:func:`dg_plugins.runtime.job_cores`):
a launcher's share (``$DG_PLUGINS_CPUS``), Slurm's cpus-per-task, else the process's CPU
affinity; ``--n_workers`` overrides them exactly. Nothing here depends on this machine's cores:
each case sets the variables it reads."""

import os

import pytest

from dg_plugins.runtime import CORES_ENV, job_cores
from dg_plugins.train.batches import worker_budget


@pytest.fixture
def no_core_settings(monkeypatch):
    monkeypatch.delenv(CORES_ENV, raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    return monkeypatch


def test_the_launchers_share_comes_first_then_slurms_then_the_affinity(no_core_settings):
    monkeypatch = no_core_settings
    assert job_cores() == (len(os.sched_getaffinity(0)), "the cores this process may run on")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert job_cores() == (6, "Slurm's cpus-per-task")
    monkeypatch.setenv(CORES_ENV, "16")
    assert job_cores() == (16, "$DG_PLUGINS_CPUS")


@pytest.mark.parametrize("value", ["0", "-2", "four"])
def test_a_bad_core_count_is_named_with_the_fix(no_core_settings, value):
    no_core_settings.setenv(CORES_ENV, value)
    with pytest.raises(ValueError, match=rf"\$DG_PLUGINS_CPUS='{value}' is not a positive number"):
        job_cores()


def test_one_worker_per_core_unless_n_workers_says_otherwise(no_core_settings):
    no_core_settings.setenv(CORES_ENV, "16")  # a GPU node's 16 cores, on any machine
    assert worker_budget() == (16, "one per core: 16 cores, $DG_PLUGINS_CPUS")
    assert worker_budget(3) == (3, "--n_workers")  # exact, not capped at the cores
    assert worker_budget(0) == (0, "--n_workers")
    no_core_settings.setenv(CORES_ENV, "1")
    assert worker_budget() == (1, "one per core: 1 core, $DG_PLUGINS_CPUS")
    with pytest.raises(ValueError, match="--n_workers must be >= 0"):
        worker_budget(-1)
