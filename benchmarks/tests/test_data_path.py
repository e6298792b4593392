"""``python -m benchmarks data_path`` as a developer runs it, small (28 JPEGs, one round, one
repeat): our configurations (image files and the decoded-image cache), and DomainBed's loaders
beside them when ``$DOMAINBED_ROOT`` names a checkout. No timing is asserted: the test checks
that every rate and ratio is measured and reported."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

from benchmarks.tests.commands import run

SMALL = ("--per_class", "1", "--image_size", "48", "--repeats", "1", "--rounds", "1",
         "--warmup", "0", "--workers", "1", "--batch_size", "2")
OURS = ("dg_plugins JPEG, 1 worker", "dg_plugins cache, 1 worker")


def run_benchmark(*args, cwd):
    return run("data_path", *args, cwd=cwd)


def check_rates(out: str, labels) -> None:
    number = r"\d+"
    for label in labels:
        assert re.search(rf"repeat 1 {re.escape(label)} +training +{number} images/s \("
                         rf"{number} per CPU s\), evaluation +{number} images/s", out), out
        assert re.search(rf"\n{re.escape(label)} +{number} +{number} +{number} +{number}\n",
                         out), out


def test_our_configurations_without_domainbed(tmp_path):
    proc = run_benchmark(*SMALL, "--domainbed", "", "--work_dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "tree of 28 JPEGs at 48x48" in out and "load average" in out
    check_rates(out, OURS)
    assert "DomainBed" not in out
    assert re.search(r"with a cold cache \(dg_plugins cache, 1 worker, repeat 1\): job build "
                     r"[\d.]+ s", out), out
    assert "Decoded-image cache: built" in out
    assert not list(tmp_path.iterdir())  # the tree, the cache and the jobs were removed


@pytest.mark.skipif(not os.environ.get("DOMAINBED_ROOT"),
                    reason="DOMAINBED_ROOT is not set: set it to a DomainBed checkout (with wilds "
                           "installed) to run DomainBed's loaders beside ours")
@pytest.mark.skipif(importlib.util.find_spec("wilds") is None,
                    reason="DomainBed needs the wilds package (pip install wilds)")
def test_against_domainbeds_loaders_prints_the_ratios(tmp_path):
    proc = run_benchmark(*SMALL, "--domainbed", os.environ["DOMAINBED_ROOT"],
                         "--domainbed_workers", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    check_rates(out, ("DomainBed (1 workers per loader)", *OURS))
    ratio = r"\d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\)"
    for key, goal in (("training", " (goal >= 1)"), ("evaluation", " (goal >= 4)")):
        assert re.search(rf"  {key}, dg_plugins cache, 1 worker: {ratio}{re.escape(goal)}",
                         out), out
        assert re.search(rf"  {key}, dg_plugins JPEG, 1 worker: {ratio}\n", out), out
        assert re.search(rf"  {key} per CPU second, dg_plugins cache, 1 worker: {ratio}", out)


def test_bad_arguments_are_refused(tmp_path):
    proc = run_benchmark("--domainbed", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "no domainbed/__init__.py there" in proc.stderr


def test_loader_cpu_ms_measures_each_case(tmp_path):
    from PIL import Image

    from benchmarks.timing import loader_cpu_ms

    path = tmp_path / "x.jpg"
    Image.new("RGB", (227, 227), (200, 30, 90)).save(path)
    ms = loader_cpu_ms(str(path), repeats=2)
    assert set(ms) == {"decode", "pil", "split", "split_cached"}
    assert all(v >= 0 for v in ms.values())
