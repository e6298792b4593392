"""Every command's ``--help`` works (``python -m dg_plugins.scripts.X --help``: exit 0, a usage
line or the command's own text, without reStructuredText markup), so that the thin entry points
in ``dg_plugins/scripts`` all reach their parsers; and each benchmark kind's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dg_plugins.scripts import benchmark

SCRIPTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "dg_plugins" / "scripts")
                 .glob("*.py") if p.stem != "__init__")


def test_every_script_is_listed():
    assert {"train", "sweep", "collect_results", "reproduce", "download"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    done = subprocess.run([sys.executable, "-m", f"dg_plugins.scripts.{script}", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:") or done.stdout.startswith(
        f"python -m dg_plugins.scripts.{script}"), done.stdout[:200]
    assert not re.search(r":[a-z]+:`|``", done.stdout), done.stdout  # no reST markup


@pytest.mark.parametrize("kind", benchmark.KINDS)
def test_help_of_every_benchmark_kind(kind):
    done = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.benchmark", kind, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-2000:]
    assert not re.search(r":[a-z]+:`|``", done.stdout), done.stdout
