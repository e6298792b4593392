"""The ``cluster`` fixture: a one-node Slurm started for a test module (:mod:`slurm_cluster`),
under the module's ``PROCTRACK``; skipped, with the reason, where it cannot start."""

from __future__ import annotations

import subprocess

import pytest

from slurm_cluster import Cluster, why_no_cluster


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    proctrack = getattr(request.module, "PROCTRACK", "linuxproc")
    reason = why_no_cluster(proctrack)
    if reason:
        pytest.skip(reason)
    started = Cluster(tmp_path_factory.mktemp("slurm"), proctrack)
    try:
        started.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        started.stop()
        pytest.skip(f"the test Slurm cluster did not start: {err}")
    yield started
    started.stop()
