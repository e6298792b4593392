"""``python -m benchmarks collect``: the generated sweep it times collect_results on (no timing
is asserted)."""

from benchmarks import collect as benchmark_collect
from dg_plugins.collect.records import load_records


def test_benchmark_smoke(tmp_path, capsys):
    out_dir = tmp_path / "bench"
    assert benchmark_collect.main(["--jobs", "60", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "wrote 60 jobs, 300 records" in out and "records/s" in out
    assert len(load_records(str(out_dir))) == 300
