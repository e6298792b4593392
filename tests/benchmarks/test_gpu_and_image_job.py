"""``benchmark gpu`` and ``benchmark image_job`` as a user runs them, small: the GPU table's
reduced CPU version (which must say that it is reduced), and the image job against DomainBed's
train.py on a tiny tree (skipped without $DOMAINBED_ROOT). No timing is asserted: the numbers
are the scripts' output, the tests check that they are measured and reported."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from devices import cpu_only
from helpers import markdown_rows as table
from processes import REPO, python_path

TIMEOUT_S = 300


def run_benchmark(*args, cwd):
    env = cpu_only(dict(os.environ, PYTHONPATH=python_path(REPO)))  # the CPU run
    return subprocess.run([sys.executable, "-m", "dg_plugins.scripts.benchmark", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=cwd)


#: A suite for gpu_check to run: a pass, a skip with its reason, a failure, a CUDA case.
TINY_SUITE = """
import pytest

def test_passes():
    assert True

def test_skips():
    pytest.skip("no such device here")

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_on(device):
    assert device
"""


def test_gpu_check_on_a_cpu_reports_the_suite_and_the_reduced_gpu_benchmark(tmp_path):
    """The GPU machine's one command (``gpu_check``, with ``--allow_cpu`` here): the suite's
    counts, failure and skip reasons and its CUDA cases in one report, with ``benchmark gpu``'s
    tables, which on a CPU are its reduced run and say so (``--benchmark_args`` passed on: one
    image per domain; bf16 where the CPU has bfloat16 instructions, else a line saying it is left
    out). Exit 1: a test failed."""
    from dg_plugins.benchmarks.gpu import cpu_precisions

    precisions = cpu_precisions()  # this machine's CPU, as the command's own default
    tests = tmp_path / "checkout" / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text("")
    (tests / "test_tiny.py").write_text(TINY_SUITE)
    report = tmp_path / "report.md"
    env = cpu_only(dict(os.environ, PYTHONPATH=python_path(REPO)))
    proc = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.gpu_check", "--allow_cpu",
                           "--tests", str(tests), "-n", "0", "--out", str(report),
                           "--benchmark_args", "--batch_size 1"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = report.read_text()
    assert proc.stdout.startswith(text)
    assert text.startswith("# GPU check\n\nDevice: no CUDA device (a CPU run")
    assert "3 passed, 1 failed, 0 errors, 1 skipped in" in text
    assert "- tests/test_tiny.py::test_fails: AssertionError: one is not two" in text
    assert "- 1 x no such device here" in text
    assert "| tests/test_tiny.py::test_on[cuda] | passed |" in text
    bench = text[text.index("## Benchmark"):]
    assert "### GPU benchmarks: REDUCED CPU RUN (no CUDA device" in bench
    assert "Device: CPU (" in bench and "Reduced: ERM ResNet-18, ERM_ViT DeiT-S/16; 1 image " in bench
    steps = table(bench, "| algorithm | precision |")
    assert [(r[0], r[1]) for r in steps] == [(label, p) for label in ("ERM ResNet-18",
                                                                      "ERM_ViT DeiT-S/16")
                                             for p in precisions]
    assert ("bf16 left out: this CPU has no bfloat16 instructions" in bench) == (
        precisions == ["fp32"])
    for _, _, step_ms, peak_gib, images_per_s in steps:
        assert float(step_ms) > 0 and float(peak_gib) > 0
        # images/s is the step's 2 images (1 per domain x 2 sources) over its time
        assert abs(float(images_per_s) - 2 / (float(step_ms) / 1000)) <= 1
    loader = table(bench, "| loader workers |")
    assert [r[0] for r in loader] == ["1", "2"] and all(float(r[1]) > 0 for r in loader)
    evaluation = table(bench, "| precision | images |")
    assert [r[0] for r in evaluation] == precisions
    assert all(int(r[1]) == 28 and float(r[3]) > 0 for r in evaluation)  # 4 x 7 x 1 JPEGs
    settings = table(bench, "| algorithm | default ms |")
    assert [r[0] for r in settings] == ["ERM ResNet-18", "ERM_ViT DeiT-S/16"]
    assert all(float(r[1]) > 0 and float(r[2].split()[0]) > 0 for r in settings)
    assert settings[1][3:] == ["-", "-"]  # no channels_last for a ViT
    advice = bench[bench.index("Recommended for this machine"):]
    assert "- Loader workers: " in advice and "- ERM ResNet-18: " in advice


def test_gpu_check_names_missing_packages_and_runs_nothing(tmp_path, monkeypatch, capsys):
    from dg_plugins.benchmarks import gpu_check

    monkeypatch.setitem(gpu_check.SUITE_MODULES, "dg_no_such_module", "dg-no-such-package")
    out = tmp_path / "report.md"
    assert gpu_check.main(["--allow_cpu", "--no_benchmark", "--out", str(out)]) == 1
    text = out.read_text()
    assert "Missing packages (the suite was not run): dg-no-such-package" in text
    assert "pip install --no-index --find-links WHEELS dg-no-such-package" in text
    assert "## Test suite" in text and "passed" not in text


def test_gpu_benchmark_refuses_an_unknown_row(tmp_path):
    proc = run_benchmark("gpu", "--algorithms", "ERM ResNet-99", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--algorithms ERM ResNet-99: not among ERM ResNet-18" in proc.stderr


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
    The jobs are as short as the timing allows (2 steps, 2 records): bf16 is emulated, slow, on
    a CPU without bfloat16 instructions."""
    monkeypatch.delenv("DOMAINBED_ROOT", raising=False)
    (tmp_path / "work").mkdir()
    proc = run_benchmark("image_job", "--eval_splits", "selection", "--precision", "fp32",
                         "bf16", "--repeats", "1", "--per_class", "1", "--image_size", "32",
                         "--steps", "2", "--checkpoint_freq", "1", "--batch_size", "1",
                         "--work_dir", "work", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for label in ("dg_plugins (selection)", "dg_plugins (selection, bf16)"):
        assert re.search(rf"repeat 1 {re.escape(label)} +wall +[\d.]+ s \(startup and end "
                         r"-?[\d.]+, training [\d.]+, evaluation -?[\d.]+\), step [\d.]+ s, ",
                         out), out
    assert "eval share" in out
    assert "DomainBed" not in out
    assert re.search(r"wall, selection bf16 / selection fp32: \d+\.\d\d \(", out), out
    assert "wall, selection bf16 / DomainBed" not in out
    assert not list((tmp_path / "work").iterdir())  # its temporary folder, removed


def test_sweep_gpu_on_a_cpu_runs_its_check_and_prints_gpu_hours(tmp_path, monkeypatch):
    """``benchmark sweep_gpu`` with a GPU name on a CPU machine (its jobs run on the CPU): ours
    one per "GPU", packed two per GPU (records equal) and packed with opt-in flags, GPU-hours
    as ratios; DomainBed's run needs $DOMAINBED_ROOT and is left out here."""
    monkeypatch.delenv("DOMAINBED_ROOT", raising=False)
    proc = run_benchmark("sweep_gpu", "--gpus", "0", "--model", "resnet18", "--test_envs", "0",
                         "--n_trials", "2", "--steps", "2", "--per_class", "1", "--image_size",
                         "32", "--batch_size", "2", "--jobs_per_gpu", "2", "--opt_in",
                         "--channels_last --deterministic false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("Sweep on GPUs: A CPU CHECK (no CUDA device): ERM resnet18")
    for label in ("ours, 1 per GPU", "ours, 2 per GPU", "ours, 2 per GPU, opt-in"):
        assert re.search(rf"^{re.escape(label)} +wall +[\d.]+ s, [\d.]+ GPU-hours$", out,
                         re.MULTILINE), out
    assert "records of the packed sweep equal the one-per-GPU sweep's: yes" in out
    assert re.search(r"GPU-hours over ours, 1 per GPU's:\n  ours, 2 per GPU: \d+\.\d\d", out)
