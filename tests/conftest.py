"""Shared test setup: offline hub, CPU, tiny backbones, caches of the test run's own."""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The tests never read or write the user's caches (a weight file cached there would change what
# an offline test sees): the caches of Hugging Face, torch.hub, XDG programs (open_clip's URL
# downloads too: dg_plugins hands it $XDG_CACHE_HOME/clip) and dg_plugins are temporary folders
# for the whole run, set before anything imports huggingface_hub (which reads them at import) and
# inherited by every subprocess. A test that needs a cache sets up its own. One folder per run:
# the process that makes it (pytest itself, or xdist's controller) removes it at the end
# (pytest_unconfigure); xdist's workers inherit it through DG_PLUGINS_TEST_CACHES.
if os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(os.environ.get(
        "DG_PLUGINS_TEST_CACHES", "")):
    TEST_CACHES, _OWN_TEST_CACHES = Path(os.environ["DG_PLUGINS_TEST_CACHES"]), False
else:
    TEST_CACHES = Path(tempfile.mkdtemp(prefix="dg_plugins_test_caches_"))
    _OWN_TEST_CACHES = True
    os.environ["DG_PLUGINS_TEST_CACHES"] = str(TEST_CACHES)
for _name in ("HF_HOME", "TORCH_HOME", "XDG_CACHE_HOME", "DG_PLUGINS_CACHE"):
    os.environ[_name] = str(TEST_CACHES / _name.lower())
for _name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HF_XET_CACHE",
              "TRANSFORMERS_CACHE"):  # each would override its folder under HF_HOME
    os.environ.pop(_name, None)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hub look-ups fail at once instead of retrying
os.environ.setdefault("DG_PLUGINS_OFFLINE", "1")
# The suite runs in 2 pytest-xdist workers (setup.cfg) that start training subprocesses: one
# torch thread per process, so that the processes never oversubscribe the cores (torch's OpenMP
# threads spin while waiting and slow each other down by an order of magnitude when they do).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The few tests that run two threads (thread-count reproducibility) share the cores with the other
# worker: their OpenMP threads wait by sleeping instead of spinning (the numbers are unchanged).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Hundreds of the suite's processes import the package: they write and read its bytecode (in
# the checkout's __pycache__ folders, which git ignores) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE, set in some containers), instead of each compiling it again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402

from dg_plugins import runtime  # noqa: E402

# Collection imports torch, timm and every test module: the cyclic garbage collector is paused
# meanwhile, then everything alive frozen (runtime.pause_collector, as the commands start), so that
# neither collection nor the collections during the tests traverse those objects again and again
# (collection: 8.9 CPU-s per worker before, 4.8 now). xdist's controller collects nothing:
# its collector is on again at once (pytest_configure).
runtime.pause_collector()

REPO = Path(__file__).resolve().parents[1]
REPO_FIXTURES = REPO / "tests" / "fixtures"
TEST_PLUGINS = REPO / "tests" / "plugins"
sys.path.insert(0, str(REPO / "tests"))  # test-only helper modules (e.g. plugin algorithms)
sys.path.insert(0, str(TEST_PLUGINS))

# Test-only plugins: every module of tests/plugins/ registers its algorithms on import, before the
# test modules are collected, so the registry-driven contract tests include them.
for _plugin in sorted(TEST_PLUGINS.glob("[!_]*.py")):
    importlib.import_module(_plugin.stem)


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "numprocesses", None):
        runtime.resume_collector()  # the xdist controller (above)


def pytest_collection_finish(session):
    runtime.resume_collector()


#: The slowest modules, slowest first (seconds of a worker in a run of the whole suite on a
#: 2-core AMD EPYC, 2026-11-29: 84 down to 16), run first. xdist hands out whole modules
#: (``--dist loadscope``, ``--no-loadscope-reorder``: in collection order): by default the
#: modules with the most tests go first, which leaves these end-to-end modules of few tests for
#: last, where one of them can keep a worker busy alone while the other waits. A module not named
#: here keeps its place after them (the order only, never what a test does).
SLOWEST_FIRST = (
    "slurm/test_slurm_lifecycle.py",  # mostly waiting on Slurm
    "test_before_after.py", "train/test_image_jobs.py", "test_paper_scripts_mpbm_ipoop.py",
    "test_sweep_scripts.py", "train/test_train_hardening.py", "train/test_cached_jobs.py",
    "sweep/test_sweep_failures.py", "algorithms/test_all_algorithms.py",
    "train/test_plugin_modules.py", "train/test_compute.py", "test_paper_scripts_vit.py",
    "train/test_train.py", "sweep/test_launchers.py", "sweep/test_sweep_costs.py",
    "sweep/test_packing.py", "train/test_udg.py", "train/test_train_reports.py",
    "collect/test_eval_splits_tables.py", "test_paper_scripts_dmg_domainnet.py",
    "test_paper_scripts_dmg_pacs.py", "train/test_resume_augmentation.py",
    "sweep/test_sweep_eval_splits.py", "alignment/test_commands_with_workers.py")


def pytest_collection_modifyitems(config, items):
    rank = {f"tests/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


def pytest_unconfigure(config):
    """The run's cache folder (see the top of this file) is removed by the process that made it."""
    if _OWN_TEST_CACHES:
        shutil.rmtree(TEST_CACHES, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_fixtures(tmp_path_factory) -> Path:
    """A folder with DomainBed's sweep data (``domainbed_sweep_data/``) and the tables DomainBed
    prints for it, from ``tests/fixtures`` (see its README): the sweep is unpacked once per
    session into a temporary folder; tests copy it before changing anything."""
    import shutil
    import tarfile

    folder = tmp_path_factory.mktemp("fixtures")
    with tarfile.open(REPO_FIXTURES / "domainbed_sweep_data.tar.gz") as archive:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            archive.extractall(folder, filter="data")
        else:
            archive.extractall(folder)
    for name in ("domainbed_sweep_data.expected_tables.txt",
                 "domainbed_sweep_data.expected_tables_latex.txt"):
        shutil.copy(REPO_FIXTURES / name, folder / name)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A decoded-image cache folder of the test's own, the cache on, the default budget."""
    from dg_plugins.datasets import decoded

    monkeypatch.setenv("DG_PLUGINS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(decoded.SWITCH_ENV, raising=False)
    monkeypatch.delenv(decoded.BUDGET_ENV, raising=False)
    return tmp_path / "cache" / "decoded"


@pytest.fixture
def small_disk(tmp_path):
    """A 100 KB tmpfs (a full disk at once); skipped where mounting is not permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(disk)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"cannot mount a small tmpfs here ({err})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)
