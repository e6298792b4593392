"""``python -m benchmarks``: its help lists every kind, every kind's ``--help`` reaches its parser
(plain text, no reStructuredText markup), a mistyped kind is refused with "did you mean", and each
kind runs a module of this folder (none ships in the package: tests/test_scripts_help.py)."""

import re

import pytest

from benchmarks import __main__ as dispatcher
from benchmarks.tests.commands import run


def test_help_lists_every_kind(tmp_path):
    done = run("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("python -m benchmarks [KIND] ARGS")
    for kind in dispatcher.KINDS:
        assert f"* {kind}: " in done.stdout
    assert not re.search(r":[a-z]+:`|``", done.stdout), done.stdout


@pytest.mark.parametrize("kind", dispatcher.KINDS)
def test_help_of_every_kind(kind, tmp_path):
    done = run(kind, "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-2000:]
    assert not re.search(r":[a-z]+:`|``", done.stdout), done.stdout


def test_gpu_check_help(tmp_path):
    done = run("--help", cwd=tmp_path, module="benchmarks.gpu_check")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: python -m benchmarks.gpu_check")


def test_a_mistyped_kind_is_refused(tmp_path):
    done = run("data_pth", cwd=tmp_path)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.startswith("error: unknown benchmark 'data_pth' (did you mean "
                                  "'data_path'?); kinds: algorithms, ")


def test_every_kind_runs_a_module_of_this_folder():
    assert all(module.startswith("benchmarks.") for module in dispatcher.MODULES.values())
