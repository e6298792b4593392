"""``python -m benchmarks image_job`` as a developer runs it, small: one image job, ours against
DomainBed's train.py on a tiny tree (skipped without $DOMAINBED_ROOT) and ours alone with bf16.
No timing is asserted: the numbers are the script's output, the tests check that they are
measured and reported."""

from __future__ import annotations

import os
import re

import pytest

from benchmarks.tests.commands import run as run_benchmark


@pytest.mark.skipif(not os.environ.get("DOMAINBED_ROOT"),
                    reason="DOMAINBED_ROOT is not set: set it to a DomainBed checkout (with wilds "
                           "and parameterized installed) to run the image job against it")
def test_image_job_benchmark_against_domainbed_prints_times_and_ratios(tmp_path):
    """The tiny job (28 JPEGs, 3 steps, a record every 2) once with ours (--eval_splits
    selection) and once with DomainBed's train.py: each run's wall, step and evaluation times
    and the ratios are printed."""
    proc = run_benchmark("image_job", "--domainbed", os.environ["DOMAINBED_ROOT"],
                         "--eval_splits", "selection", "--repeats", "1", "--per_class", "1",
                         "--image_size", "32", "--steps", "3", "--checkpoint_freq", "2",
                         "--batch_size", "2", "--model", "resnet50", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Image job: ERM, ResNet-50" in out
    assert "tree of 28 JPEGs at 32x32" in out and "load average" in out
    for label in ("dg_plugins (selection)", "DomainBed"):
        run = re.search(rf"repeat 1 {re.escape(label)} +wall +([\d.]+) s \(startup and end "
                        r"(-?[\d.]+), training ([\d.]+), evaluation (-?[\d.]+)\), step ([\d.]+) "
                        r"s, one evaluation (-?[\d.]+) s, 2 records", out)
        assert run, out
        wall, startup, training, evaluation = map(float, run.groups()[:4])
        assert wall > training > 0 and abs(startup + training + evaluation - wall) < 0.2, out
    assert re.search(r"wall, selection / DomainBed: \d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\) "
                     r"\(goal <= 0\.35\)", out), out
    assert "evaluation, selection / DomainBed" in out
    assert not list(tmp_path.iterdir())  # the tree and the jobs were in a removed folder


def test_image_job_benchmark_with_bf16_runs_and_without_domainbed(tmp_path, monkeypatch):
    """Without a DomainBed checkout only ours run; ``--precision fp32 bf16`` adds the bf16 job
    and its ratio to the fp32 job. ``--work_dir`` as typed, relative to the working directory.
    The jobs are as short as the timing allows (2 steps, 2 records, ``--train_size 32``): bf16 is
    emulated, slow, on a CPU without bfloat16 instructions."""
    monkeypatch.delenv("DOMAINBED_ROOT", raising=False)
    (tmp_path / "work").mkdir()
    proc = run_benchmark("image_job", "--eval_splits", "selection", "--precision", "fp32",
                         "bf16", "--repeats", "1", "--per_class", "1", "--image_size", "32",
                         "--train_size", "32", "--steps", "2", "--checkpoint_freq", "1",
                         "--batch_size", "1", "--work_dir", "work", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "tree of 28 JPEGs at 32x32 trained at 32, test env 0" in out
    for label in ("dg_plugins (selection)", "dg_plugins (selection, bf16)"):
        assert re.search(rf"repeat 1 {re.escape(label)} +wall +[\d.]+ s \(startup and end "
                         r"-?[\d.]+, training [\d.]+, evaluation -?[\d.]+\), step [\d.]+ s, ",
                         out), out
    assert "eval share" in out
    assert "DomainBed" not in out
    assert re.search(r"wall, selection bf16 / selection fp32: \d+\.\d\d \(", out), out
    assert "wall, selection bf16 / DomainBed" not in out
    assert not list((tmp_path / "work").iterdir())  # its temporary folder, removed


def test_its_flags_are_borrowed_from_train():
    """A benchmark that hands a flag's values to train jobs borrows train's row: its choices
    and its spelling (``tests/job/test_flag_table.py`` tests ``borrow`` itself)."""
    from benchmarks import image_job
    from dg_plugins.job.flags import ROWS, option

    args = image_job.build_parser().parse_args(["--precision", "fp32", "bf16"])
    assert args.precision == ["fp32", "bf16"]
    assert args.eval_splits == list(ROWS["eval_splits"].choices)  # both, the benchmark's default
    assert option("eval_splits") == "--eval_splits"


@pytest.mark.parametrize("module", ["image_job", "sweep_gpu"])
def test_a_train_size_the_jobs_cannot_run_is_refused(module, tmp_path, capsys):
    """``--train_size`` beside DomainBed (which trains at 224 only) or outside the image_size
    hparam's range: one line and exit status 2."""
    import importlib

    main = importlib.import_module(f"benchmarks.{module}").main
    gpus = ["--gpus", "0"] if module == "sweep_gpu" else []
    (tmp_path / "domainbed" / "scripts").mkdir(parents=True)
    (tmp_path / "domainbed" / "scripts" / "train.py").write_text("")  # a checkout's shape
    assert main([*gpus, "--domainbed", str(tmp_path), "--train_size", "32"]) == 2
    assert "--train_size 32: DomainBed trains at 224 only" in capsys.readouterr().err
    assert main([*gpus, "--train_size", "40"]) == 2
    assert "--train_size 40: hparam 'image_size' must be a multiple of 16" in (
        capsys.readouterr().err)
