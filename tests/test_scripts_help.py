"""Every command's ``--help`` works (``python -m dg_plugins.scripts.X --help``: exit 0, a usage
line or the command's own text, without reStructuredText markup), so that the thin entry points
in ``dg_plugins/scripts`` all reach their parsers; and each benchmark kind's (only ``gpu`` ships:
the developer benchmarks are the source checkout's ``python -m benchmarks``)."""

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


@pytest.mark.parametrize("argv, kind, checkout", [
    (["data_path", "--per_class", "1"], "data_path", "data_path --per_class 1"),
    (["--dataset", "Debug224", "--hparams", '{"a": 1}'], "algorithms",
     """algorithms --dataset Debug224 --hparams '{"a": 1}'""")])
def test_benchmark_names_the_checkout_command_of_a_developer_benchmark(tmp_path, argv, kind,
                                                                       checkout):
    """Only ``benchmark gpu`` ships; a developer benchmark (flags first: the former default,
    algorithms) is one line naming its command in the source checkout."""
    done = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.benchmark", *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr == (f"error: benchmark {kind} is a developer benchmark of the source "
                           f"checkout: from its root, python -m benchmarks {checkout}; this "
                           "command runs gpu\n")


def test_only_benchmark_gpu_and_what_it_needs_ship():
    """The developer benchmarks and gpu_check live in the source checkout's ``benchmarks/``."""
    import pkgutil

    package = Path(__file__).resolve().parents[1] / "dg_plugins"
    shipped = {f"{folder}.{m.name}" for folder in ("benchmarks", "scripts")
               for m in pkgutil.iter_modules([str(package / folder)])}
    assert {m for m in shipped if "benchmark" in m or "gpu_check" in m} == {
        "benchmarks.gpu", "benchmarks.timing", "benchmarks.memory", "benchmarks.data",
        "scripts.benchmark"}


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
def test_a_mistyped_flag_is_a_usage_line_and_the_error_with_did_you_mean(tmp_path, script, argv,
                                                                         error):
    """argparse's own usage block lists every flag (30 lines for train) above the error."""
    done = subprocess.run([sys.executable, "-m", f"dg_plugins.scripts.{script}", *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    usage, message = done.stderr.splitlines()
    assert usage.startswith("usage: ") and usage.endswith("[FLAGS] (every flag: --help)")
    assert message.endswith(f"error: {error}"), message
    assert not done.stdout


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
