"""The benchmark harness runs every registered algorithm and reports ratios against the baseline
(no timing assertion: speed targets are met in benchmark runs, never in unit tests)."""

import pytest

from dg_plugins.registry import ALGORITHMS, UnknownNameError
from dg_plugins.scripts import benchmark


def test_benchmark_prints_ratios_for_every_algorithm(capsys):
    assert benchmark.main(["--steps", "1", "--warmup", "0", "--tiny", "--predict"]) == 0
    out = capsys.readouterr().out
    assert "Per-step cost relative to ERM" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ALGORITHMS}
    assert set(rows) >= {n for n, cls in ALGORITHMS.items()
                         if cls.__module__.startswith("dg_plugins.")}
    erm = rows["ERM"]
    assert erm[2] == "1.00" and erm[4] == "1.00" and erm[6] == "1.00"  # step, predict, memory
    assert float(erm[7]) > 0  # parameters, in millions


def test_benchmark_baseline_and_names_are_checked():
    with pytest.raises(UnknownNameError, match="did you mean 'ERM'"):
        benchmark.main(["--steps", "1", "--baseline", "ERN"])


def test_alternating_medians_times_the_calls_in_turn():
    """One call of each entry per round (so load changes hit every entry alike), the warm-up
    rounds untimed, medians in seconds."""
    import time

    from dg_plugins.runtime import alternating_medians

    order = []
    calls = {"fast": lambda: order.append("fast"),
             "slow": lambda: (order.append("slow"), time.sleep(0.02))}
    med = alternating_medians(calls, steps=3, warmup=1, device="cpu")
    assert order == ["fast", "slow"] * 4
    assert set(med) == {"fast", "slow"}
    assert med["slow"] >= 0.02 > med["fast"]
