"""Every command's ``--help`` works (``python -m dg_plugins.scripts.X --help``: exit 0, a usage
line or the command's own text, without reStructuredText markup), so that the thin entry points
in ``dg_plugins/scripts`` all reach their parsers; no benchmark ships (they are the source
checkout's ``python -m benchmarks``, whose tests check their helps).

The commands' runs that these tests read (helps, usage errors) are made in one Python process
(:func:`ran`): each command module run as ``python -m`` runs it (``runpy``, as ``__main__``, with
its ``sys.argv``), its exit status, stdout and stderr kept; ``train --help`` is also run as a
process of its own."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


SCRIPTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "dg_plugins" / "scripts")
                 .glob("*.py") if p.stem != "__init__")

#: Runs each ``[module, argv, cwd]`` read from stdin as ``python -m module *argv`` would from cwd
#: (its ``__main__``), one after the other; prints ``[[exit status, stdout, stderr], ...]``.
RUNNER = r"""
import contextlib, io, json, os, runpy, sys, traceback

results = []
for module, argv, cwd in json.load(sys.stdin):
    out, err, status = io.StringIO(), io.StringIO(), 0
    os.chdir(cwd)
    sys.argv = [module, *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            status = stop.code
            if status is None:
                status = 0
            elif not isinstance(status, int):
                print(status, file=sys.stderr)
                status = 1
        except BaseException:
            traceback.print_exc()
            status = 1
    results.append([status, out.getvalue(), err.getvalue()])
print(json.dumps(results), file=sys.__stdout__)
"""


def run_in_one_process(runs: list[tuple[str, list[str], str]]) -> list[tuple[int, str, str]]:
    """``[(module, argv, cwd)]`` -> ``[(exit status, stdout, stderr)]``, run by :data:`RUNNER`."""
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(runs),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(result) for result in json.loads(done.stdout)]


def script_module(script: str) -> str:
    return f"dg_plugins.scripts.{script}"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every run the tests below read, by ``(script, *argv)``: each command's ``--help`` and the
    mistyped flags (from an empty folder)."""
    cwd = str(tmp_path_factory.mktemp("scripts_cwd"))
    runs = [(script, ["--help"]) for script in SCRIPTS]
    runs += [(script, argv) for script, argv, _ in MISTYPED]
    results = run_in_one_process([(script_module(s), argv, cwd) for s, argv in runs])
    return {(s, *argv): result for (s, argv), result in zip(runs, results)}


def test_every_script_is_listed():
    assert {"train", "sweep", "collect_results", "reproduce", "download"} <= set(SCRIPTS)


def check_help(script, status, stdout, stderr):
    assert status == 0, stderr[-2000:]
    assert stdout.startswith("usage:") or stdout.startswith(
        f"python -m dg_plugins.scripts.{script}"), stdout[:200]
    assert not re.search(r":[a-z]+:`|``", stdout), stdout  # no reST markup


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(ran, script):
    check_help(script, *ran[script, "--help"])


def test_help_as_its_own_process():
    """The real ``python -m`` entry, alone in its process (train's: it imports no torch)."""
    done = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.train", "--help"],
                          capture_output=True, text=True, timeout=120)
    check_help("train", done.returncode, done.stdout, done.stderr)
    assert done.stdout.startswith("usage:") and "--dataset" in done.stdout


def test_no_benchmark_ships():
    """Every benchmark, ``gpu`` included, is the source checkout's ``python -m benchmarks``."""
    package = Path(__file__).resolve().parents[1] / "dg_plugins"
    shipped = [str(p.relative_to(package)) for p in package.rglob("*.py")]
    assert not [m for m in shipped if "benchmark" in m or "gpu_check" in m], shipped


# issue 58: a usage error is a short usage line and the error, with "did you mean" -------------

MISTYPED = [
    ("train", ["--dataset", "Debug28", "--stpes", "5"], "unrecognized arguments: --stpes 5; "
     "did you mean --steps?"),
    ("train", ["--precision", "fp61"], "argument --precision: invalid choice: 'fp61' (choose "
     "from 'fp32', 'bf16', 'fp16'); did you mean 'fp16'?"),
    ("collect_results", ["--input_dri", "sweep"], "the following arguments are required: "
     "--input_dir; did you mean --input_dir?"),
    ("collect_results", ["--input_dir", "sweep", "--lattex"], "unrecognized arguments: --lattex; "
     "did you mean --latex?"),
    ("check_data", ["--dataset", "PACS", "--data_dri", "data"], "the following arguments are "
     "required: --data_dir; did you mean --data_dir?"),
    ("download", ["PACS", "--data_dri", "data"], "unrecognized arguments: --data_dri data; did "
     "you mean --data_dir?"),
    ("alignment_eval", ["--alignmnet_scores", "s.csv", "job"], "the following arguments are "
     "required: --alignment_scores; did you mean --alignment_scores?"),
    ("alignment_scores", ["--dataset", "PACS", "--data_dri", "data"], "the following arguments "
     "are required: --data_dir; did you mean --data_dir?"),
]


@pytest.mark.parametrize("script, argv, error", MISTYPED,
                         ids=[f"{s}-{a[-2]}" for s, a, _ in MISTYPED])
def test_a_mistyped_flag_is_a_usage_line_and_the_error_with_did_you_mean(ran, script, argv,
                                                                         error):
    """argparse's own usage block lists every flag (30 lines for train) above the error."""
    status, stdout, stderr = ran[(script, *argv)]
    assert status == 2, stderr[-2000:]
    usage, message = stderr.splitlines()
    assert usage.startswith("usage: ") and usage.endswith("[FLAGS] (every flag: --help)")
    assert message.endswith(f"error: {error}"), message
    assert not stdout


def test_train_help_is_argparse_own(monkeypatch):
    """The short usage changes errors only: train's --help is what argparse's parser prints."""
    import argparse

    from dg_plugins.job import flags

    ours = flags.build_train_parser().format_help()
    monkeypatch.setattr(flags, "CommandParser",
                        lambda short_usage, **options: argparse.ArgumentParser(**options))
    assert ours == flags.build_train_parser().format_help()


def test_a_parser_reads_its_arguments_from_any_iterable():
    """An iterator of arguments (``map(str, argv)``) is parsed, not used up by the "did you mean"
    bookkeeping first (a map used to leave every flag at its default)."""
    from dg_plugins.train import cli as train_cli

    args = train_cli.build_parser().parse_args(map(str, ["--dataset", "Debug28", "--steps", 3]))
    assert (args.dataset, args.steps) == ("Debug28", 3)
