"""``python -m benchmarks gpu`` and
``python -m benchmarks.gpu_check``, small: the GPU table's reduced CPU version (which must say
that it is reduced) inside gpu_check's report. No timing is asserted: the numbers are the
scripts' output, the tests check that they are measured and reported."""

from __future__ import annotations

from support.helpers import markdown_rows as table

from benchmarks.tests.commands import run


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
    out; ``--junitxml`` keeps pytest's XML). Exit 1: a test failed."""
    from benchmarks.gpu import cpu_precisions

    precisions = cpu_precisions()  # this machine's CPU, as the command's own default
    tests = tmp_path / "checkout" / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text("")
    (tests / "test_tiny.py").write_text(TINY_SUITE)
    report = tmp_path / "report.md"
    junit = tmp_path / "junit.xml"
    proc = run("--allow_cpu", "--tests", str(tests), "-n", "0", "--out", str(report),
               "--junitxml", str(junit), "--benchmark_args", "--batch_size 1", cwd=tmp_path,
               module="benchmarks.gpu_check")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "one is not two" in junit.read_text()  # kept: each failure's whole text
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
    from benchmarks import gpu_check

    monkeypatch.setitem(gpu_check.SUITE_MODULES, "dg_no_such_module", "dg-no-such-package")
    out = tmp_path / "report.md"
    assert gpu_check.main(["--allow_cpu", "--no_benchmark", "--out", str(out)]) == 1
    text = out.read_text()
    assert "Missing packages (the suite was not run): dg-no-such-package" in text
    assert "pip install --no-index --find-links WHEELS dg-no-such-package" in text
    assert "## Test suite" in text and "passed" not in text


def test_gpu_benchmark_refuses_an_unknown_row(tmp_path):
    proc = run("gpu", "--algorithms", "ERM ResNet-99", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--algorithms ERM ResNet-99: not among ERM ResNet-18" in proc.stderr
