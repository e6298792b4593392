"""``python -m benchmarks``: its help lists every kind, every kind's ``--help`` reaches its parser
(plain text, no reStructuredText markup), a mistyped kind is refused with "did you mean", and the
package's ``benchmark`` command knows the kinds that live here."""

import re

import pytest

from benchmarks import __main__ as dispatcher
from benchmarks.tests.commands import run
from dg_plugins.scripts import benchmark as package_command


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


def test_the_package_command_names_every_kind_that_lives_here():
    assert set(dispatcher.KINDS) == set(package_command.KINDS + package_command.CHECKOUT_KINDS)
    for kind in package_command.KINDS:  # what ships runs the same module from here
        assert dispatcher.MODULES[kind] == f"dg_plugins.benchmarks.{kind}"
