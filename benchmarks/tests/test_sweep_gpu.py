"""``python -m benchmarks sweep_gpu`` as a developer runs it, small, on a CPU (no timing is
asserted)."""

from __future__ import annotations

import re

from benchmarks.tests.commands import run as run_benchmark


def test_sweep_gpu_on_a_cpu_runs_its_check_and_prints_gpu_hours(tmp_path, monkeypatch):
    """``benchmark sweep_gpu`` with a GPU name on a CPU machine (its jobs run on the CPU): ours
    one per "GPU", packed two per GPU (records equal) and packed with opt-in flags, GPU-hours
    as ratios; DomainBed's run needs $DOMAINBED_ROOT and is left out here, so the jobs train
    at 32x32 (``--train_size``)."""
    monkeypatch.delenv("DOMAINBED_ROOT", raising=False)
    proc = run_benchmark("sweep_gpu", "--gpus", "0", "--model", "resnet18", "--test_envs", "0",
                         "--n_trials", "2", "--steps", "2", "--per_class", "1", "--image_size",
                         "32", "--train_size", "32", "--batch_size", "2", "--jobs_per_gpu", "2",
                         "--opt_in", "--channels_last --deterministic false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("Sweep on GPUs: A CPU CHECK (no CUDA device): ERM resnet18")
    for label in ("ours, 1 per GPU", "ours, 2 per GPU", "ours, 2 per GPU, opt-in"):
        assert re.search(rf"^{re.escape(label)} +wall +[\d.]+ s, [\d.]+ GPU-hours$", out,
                         re.MULTILINE), out
    assert "records of the packed sweep equal the one-per-GPU sweep's: yes" in out
    assert re.search(r"GPU-hours over ours, 1 per GPU's:\n  ours, 2 per GPU: \d+\.\d\d", out)
