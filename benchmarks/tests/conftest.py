"""The benchmarks' tests run under the suite's own setup (``tests/conftest.py``: offline, the
run's caches in a temporary folder, one torch thread per process, the test-only plugins, the
helper modules of ``tests/`` importable), loaded here under a name of its own with its hooks and
fixtures. Run them from the checkout's root: ``python -m pytest -q benchmarks/tests``."""

import importlib.util
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "dg_plugins_suite_conftest", Path(__file__).resolve().parents[2] / "tests" / "conftest.py")
_SUITE = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = _SUITE
_SPEC.loader.exec_module(_SUITE)

# its hooks (pytest_*) and fixtures, with the rest of its public names
globals().update({name: value for name, value in vars(_SUITE).items()
                  if not name.startswith("_")})

#: The slowest modules first (seconds of one worker on a 2-core AMD EPYC: 42, 34, 18), so that
#: the two xdist workers finish together (the suite's own order, kept for modules not named).
SLOWEST_FIRST = ("test_sweep_gpu.py", "test_gpu.py", "test_image_job.py")


def pytest_collection_modifyitems(config, items):
    rank = {f"benchmarks/tests/{name}": i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable
