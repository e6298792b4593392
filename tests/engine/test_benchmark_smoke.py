"""The benchmark harness runs and reports ratios against ERM (no timing assertion)."""

from dg_plugins.scripts import benchmark


def test_benchmark_prints_ratios(capsys):
    assert benchmark.main(["--steps", "1", "--warmup", "0", "--algorithms", "ERM"]) == 0
    out = capsys.readouterr().out
    assert "Per-step cost relative to ERM" in out
    erm = next(line for line in out.splitlines() if line.startswith("ERM "))
    assert erm.split()[2] == "1.00" and erm.split()[4] == "1.00"
