"""``python -m benchmarks [algorithms]`` runs every registered algorithm and reports ratios against
the baseline (no timing assertion: speed targets are met in benchmark runs, never in unit
tests); the timers it shares with ``benchmark gpu``."""

import pytest

from dg_plugins.registry import ALGORITHMS, UnknownNameError
from benchmarks import algorithms as benchmark


def test_benchmark_prints_ratios_for_every_algorithm(capsys):
    assert benchmark.main(["--steps", "1", "--warmup", "0", "--tiny", "--predict"]) == 0
    out = capsys.readouterr().out
    assert "Per-step cost relative to ERM" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ALGORITHMS}
    assert set(rows) >= {n for n, cls in ALGORITHMS.items()
                         if cls.__module__.startswith("dg_plugins.")}
    erm = rows["ERM"]
    # step ratio and its quartiles, predict, memory
    assert erm[2] == "1.00" and erm[3] == "(1.00-1.00)" and erm[5] == "1.00" and erm[7] == "1.00"
    assert float(erm[8]) > 0  # parameters, in millions


def test_benchmark_baseline_and_names_are_checked():
    with pytest.raises(UnknownNameError, match="did you mean 'ERM'"):
        benchmark.main(["--steps", "1", "--baseline", "ERN"])


def test_alternating_medians_times_the_calls_in_turn():
    """One call of each entry per round (so load changes hit every entry alike), the warm-up
    rounds untimed, medians in seconds."""
    import time

    from benchmarks.timing import alternating_medians

    order = []
    calls = {"fast": lambda: order.append("fast"),
             "slow": lambda: (order.append("slow"), time.sleep(0.02))}
    med = alternating_medians(calls, steps=3, warmup=1, device="cpu")
    assert order == ["fast", "slow"] * 4
    assert set(med) == {"fast", "slow"}
    assert med["slow"] >= 0.02 > med["fast"]


def test_paired_ratio_is_the_median_of_per_round_ratios_with_quartiles():
    from benchmarks.timing import paired_ratio

    base = [1.0, 2.0, 1.0, 4.0, 1.0]  # the machine slows down in rounds 2 and 4
    times = [1.1, 2.2, 1.1, 4.4, 1.3]
    low, mid, high = paired_ratio(times, base)
    assert abs(mid - 1.1) < 1e-9  # a ratio of medians would say 1.1 / 1.0 here by luck only
    assert low <= mid <= high and abs(high - 1.2) < 1e-9
    assert paired_ratio([3.0], [2.0]) == (1.5, 1.5, 1.5)


def test_benchmark_times_each_algorithm_in_bf16_against_its_fp32_step(capsys):
    assert benchmark.main(["--algorithms", "ERM", "--tiny", "--steps", "1", "--warmup", "0",
                           "--precision", "bf16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("ERM")}
    assert set(rows) == {"ERM", "ERM:bf16"}
    assert rows["ERM"][4:6] == ["1.00", "(1.00-1.00)"]  # x fp32 of the fp32 row itself
    assert float(rows["ERM:bf16"][4]) > 0 and "avx512_bf16" in out
    assert "--precision bf16: each algorithm also stepped under autocast to bf16" in out
    assert benchmark.main(["--algorithms", "ERM", "--precision", "fp16", "--device", "cpu"]) == 2
    assert "use --precision bf16" in capsys.readouterr().err
