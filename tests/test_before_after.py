"""Nothing changes for users (issue 35): the small sweep of ``tests/before_after.py``, run as a
user runs it (sweep with the local launcher and default loader workers, train, collect_results in
every format), gives what the code gave before the move into train/, sweep/ and collect/
(``tests/fixtures/before_after/``): the same job-folder names, the same records and byte-identical
tables, sweep output and exit statuses.

Records are compared without their wall-clock fields (``step_time``, ``mem_gb``). Accuracies,
counts, steps, hparams and args must be equal exactly; other floats (losses and the algorithms'
other values) to a relative 1e-6, since CPU kernels may round differently on another machine,
which moves a loss in its last digits but not an argmax. The jobs run on the CPU with one thread
(``CUDA_VISIBLE_DEVICES=""``, ``OMP_NUM_THREADS=1``), as when the fixture was made."""

import math
import re

import pytest

import before_after

EXACT = re.compile(r"env\d+_\w+_(acc|count)|step|epoch|num_classes")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("before_after")
    return before_after.snapshot(root, before_after.run_all(root)), before_after.read_fixture()


def close(key, now, then) -> bool:
    if isinstance(now, float) and isinstance(then, float) and not EXACT.fullmatch(key):
        return (math.isnan(now) and math.isnan(then)) or math.isclose(now, then, rel_tol=1e-6)
    if isinstance(now, float) and isinstance(then, float) and math.isnan(now):
        return math.isnan(then)
    return now == then


def test_same_job_folders(runs):
    now, then = runs
    assert now["folders"] == then["folders"]


def test_same_records(runs):
    now, then = runs
    for folder in then["folders"]:
        new, old = now["records"][folder], then["records"][folder]
        assert len(new) == len(old), folder
        for line, (a, b) in enumerate(zip(new, old), 1):
            assert sorted(a) == sorted(b), (folder, line)
            differ = [k for k in b if not close(k, a[k], b[k])]
            assert not differ, (folder, line, {k: (a[k], b[k]) for k in differ})


@pytest.mark.parametrize("name", list(before_after.COLLECTS))
def test_byte_identical_tables(runs, name):
    now, then = runs
    assert now["tables"][name] == then["tables"][name]


@pytest.mark.parametrize("name", list(before_after.SWEEPS))
def test_same_sweep_output(runs, name):
    now, then = runs
    assert now["sweeps"][name] == then["sweeps"][name]
