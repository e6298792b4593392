"""The test run's own caches (tests/conftest.py): every process of a run (pytest-xdist's
controller and its workers) uses one temporary folder for HF_HOME, TORCH_HOME, XDG_CACHE_HOME and
dg_plugins' cache, and the run leaves nothing behind in the temporary directory."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_run_uses_one_cache_folder_of_its_own():
    caches = Path(os.environ["DG_PLUGINS_TEST_CACHES"])
    assert caches.is_dir() and caches.name.startswith("dg_plugins_test_caches_")
    for name in ("HF_HOME", "TORCH_HOME", "XDG_CACHE_HOME", "DG_PLUGINS_CACHE"):
        assert Path(os.environ[name]).parent == caches, name


def test_a_run_with_two_workers_leaves_no_cache_folder_behind(tmp_path):
    """Each xdist process used to make a folder of its own, and the controller's was never
    removed: one empty folder left in the temporary directory per run."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DG_PLUGINS_TEST_CACHES", "PYTEST_XDIST_WORKER")}
    env["TMPDIR"] = str(scratch)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "tests/test_run_caches.py::test_the_run_uses_one_cache_folder_of_its_own",
         "tests/collect/test_single_source.py::test_loo_does_not_apply"],  # a quick test each
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    assert sorted(p.name for p in scratch.glob("dg_plugins_test_caches_*")) == []
