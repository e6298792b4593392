"""The test clusters: one-node Slurms (:mod:`slurm_cluster`) under ``proctrack/linuxproc`` and
``proctrack/cgroup``, started together for the module that asks and stopped after it; one that
cannot start is a skip reason instead, named by the tests that need it."""

from __future__ import annotations

import subprocess

import pytest

from slurm_cluster import PROCTRACKS, Cluster, running, why_no_cluster


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """``{proctrack: Cluster, or the reason it could not start}``."""
    started = {}
    for proctrack in PROCTRACKS:
        reason = why_no_cluster(proctrack)
        if reason:
            started[proctrack] = reason
            continue
        cluster = Cluster(tmp_path_factory.mktemp(f"slurm_{proctrack}"), proctrack)
        try:
            cluster.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            cluster.stop()
            started[proctrack] = f"the test Slurm cluster did not start: {err}"
            continue
        started[proctrack] = cluster
    yield started
    for cluster in started.values():
        if isinstance(cluster, Cluster):
            cluster.stop()


@pytest.fixture(scope="module")
def cluster(clusters):
    return running(clusters, "linuxproc")
