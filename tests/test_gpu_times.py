"""``dg_plugins/reference/gpu_step_times.json`` (the measured GPU times behind reproduce's
GPU-hours) against the results file it was copied from, and its checks."""

from __future__ import annotations

import json

import pytest
from support.helpers import markdown_rows
from support.processes import REPO

from dg_plugins.reference import gpu_times


def test_gpu_times_are_those_of_the_results_file():
    """Every step time is the fp32 row of the results file's first training-step table (the
    file's device and date, at the batch it names), and the evaluation rate is a fp32 row of an
    evaluation table there, with the loader workers the data file names."""
    times = gpu_times.load()
    text = (REPO / times.file).read_text()
    first_run = text.split("\n## Second run")[0]
    assert f"Device: {times.device_detail}; {times.date};" in first_run
    assert (f"{times.batch_per_domain} images per domain x {times.source_domains} source domains"
            in first_run)
    rows = {(label, precision): float(ms) for label, precision, ms, *_ in
            markdown_rows(first_run, "| algorithm | precision | step ms |")}
    aliases = {"GMoE DeiT-S/16": "GMoE-S/16"}  # the results file's name of GMoE's row
    assert times.step_ms == {label: rows[(aliases.get(label, label), times.train_precision)]
                             for label in times.step_ms}
    assert len(times.step_ms) == len(rows) // 2  # every algorithm row, fp32 and bf16
    evaluations = [(int(n), int(workers), float(rate)) for part in text.split("Evaluation (")[1:]
                   for precision, n, workers, rate in markdown_rows(part, "| precision | images |")
                   if precision == "fp32"]
    assert max(evaluations) == (1120, times.eval_workers, times.eval_images_per_second)


def test_a_malformed_file_names_its_field(tmp_path):
    data = json.loads(open(gpu_times.GPU_TIMES_FILE, encoding="utf-8").read())
    data["train_step"]["ms"]["ERM ResNet-18"] = -1
    path = tmp_path / "times.json"
    path.write_text(json.dumps(data))
    with pytest.raises(gpu_times.GpuTimesError, match=r"train_step.ms\['ERM ResNet-18'\]"):
        gpu_times.load(str(path))
    del data["evaluation"]
    path.write_text(json.dumps(data))
    with pytest.raises(gpu_times.GpuTimesError, match="evaluation"):
        gpu_times.load(str(path))
