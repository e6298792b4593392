"""Every ``sweeps/*.sh`` under its one calling convention (``sweeps/_common.sh``) and the paper
settings behind the paper scripts (``dg_plugins/reference/paper_settings.py``, run by
``python -m dg_plugins.scripts.reproduce``).

Each script runs with ``DRY_RUN=1`` in each of its protocols (``PROTOCOL``), a fake
``DATA_DIR`` (tiny image trees), a temporary ``OUTPUT_DIR`` and empty download caches
(:mod:`paper_runs`): its bash part as a subprocess, the one command it hands the interpreter
replayed with the others in one Python process (each as ``python -m`` runs it; two scripts also
run wholly with the real interpreter and must print the same). It must exit 0, create nothing,
start no process (a ``sitecustomize`` logs every Python process started), and list its jobs
with their count and total steps; a paper script also warns of what a real run would miss (here
the pretrained weights and split lists), and its header names each of those prerequisites. The
jobs a paper script lists must carry exactly the table's settings, in their train args and in
the hparams train resolves from them. Last, the quick start, stopped in the middle of a job,
continues where it stopped when run again. The paper scripts' real runs:
tests/test_paper_scripts_*.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dg_plugins import catalog
from dg_plugins import hparams as H
from dg_plugins.job.sizes import in_split_size
from dg_plugins.reference import paper_settings as ps
from support.image_tree import draw_image
from support.paper_runs import KNOBS, REPO, STAND_IN, SWEEPS, script_env
from support.processes import as_from_a_terminal, python_path

SCRIPTS = sorted(p.name for p in SWEEPS.glob("*.sh") if not p.name.startswith("_"))
PAPER_SCRIPTS = {Path(s.script).name: s for s in ps.SETTINGS.values()}
CASES = [(name, protocol) for name in SCRIPTS
         for protocol in (PAPER_SCRIPTS[name].protocols if name in PAPER_SCRIPTS else [None])]
SCRIPT_TIMEOUT_S = 300

#: Images per environment of the fake data (DomainBed's folder names), distinct per domain.
FAKE_FOLDERS = {
    "PACS": ("PACS", ("art_painting", "cartoon", "photo", "sketch")),
    "VLCS": ("VLCS", ("Caltech101", "LabelMe", "SUN09", "VOC2007")),
    "OfficeHome": ("office_home", ("Art", "Clipart", "Product", "Real World")),
    "TerraIncognita": ("terra_incognita", ("location_100", "location_38", "location_43",
                                           "location_46")),
    "DomainNet": ("domain_net", ("clipart", "infograph", "painting", "quickdraw", "real",
                                 "sketch")),
}
#: DomainNet's fake classes: two of DomainNet-20's and one outside it.
FAKE_DOMAINNET_CLASSES = ("bee", "zigzag", "airplane")

def fake_images(env_index: int, class_index: int) -> int:
    return 1 + (env_index + class_index) % 3


def make_fake_data(root: Path) -> dict[str, list[int]]:
    """Tiny JPEG trees in DomainBed's layout; returns the image count per environment (DomainNet
    also as DomainNet20: its classes of DomainNet-20 only)."""
    import random

    rng = random.Random(0)
    counts = {}
    for dataset, (folder, envs) in FAKE_FOLDERS.items():
        classes = FAKE_DOMAINNET_CLASSES if dataset == "DomainNet" else ("a", "b")
        counts[dataset] = []
        counts20 = []
        for e, env in enumerate(envs):
            total = total20 = 0
            for c, name in enumerate(classes):
                path = root / folder / env / name
                path.mkdir(parents=True)
                for k in range(fake_images(e, c)):
                    draw_image(rng, c, e, 16).save(path / f"{k}.jpg")
                total += fake_images(e, c)
                total20 += fake_images(e, c) if name != "airplane" else 0
            counts[dataset].append(total)
            counts20.append(total20)
        if dataset == "DomainNet":
            counts["DomainNet20"] = counts20
    return counts


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return root, make_fake_data(root)


#: The dry runs that run wholly as a user runs them (the real interpreter as PYTHON): a paper
#: script (reproduce's own dry run) and a plain sweep script (finish_dry_run's listing).
REAL_DRY_RUNS = (("dmg_pacs_paper.sh", "release"), ("digits_offline_multi_source.sh", None))

#: Runs the recorded commands one after another in this one Python process, each as
#: ``python -m MODULE ARGS`` runs it (runpy, the command's environment and folder, its output
#: captured); any process a command starts logs itself to that command's own process log.
REPLAY = """
import contextlib, io, json, os, runpy, sys
calls, into, results = json.load(open(sys.argv[1])), sys.argv[2], []
for call in calls:
    assert call["argv"][0] == "-m", call["argv"]
    os.environ.clear()
    os.environ.update(call["env"])
    os.chdir(call["cwd"])
    sys.argv = [call["argv"][1], *call["argv"][2:]]
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_module(call["argv"][1], run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
    results.append({"returncode": code, "stdout": stdout.getvalue(),
                    "stderr": stderr.getvalue()})
with open(into, "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def dry_runs(data, tmp_path_factory):
    """Every (script, protocol) run once with DRY_RUN=1, each as a user runs it (``PROTOCOL=P bash
    sweeps/<script>``). Each script's bash part runs as a subprocess (four at a time) with a
    stand-in PYTHON that records the one command it hands the interpreter (``reproduce ...
    --dry_run`` or ``--dry_run_sweeps``); then all those commands run in one Python process, one
    after another, each as ``python -m`` runs it (its arguments, environment, folder; its own
    process log). The REAL_DRY_RUNS also run wholly as subprocesses with the real interpreter:
    their output must be the replay's (the replay is the real run, in fewer processes). Each
    case: (its result, its output folder, what it started: the command handed to the
    interpreter, the processes that command started, and for a real run its result and
    processes)."""
    from types import SimpleNamespace

    data_dir, _ = data
    tmp = tmp_path_factory.mktemp("dry_runs")
    stand_in = tmp / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)

    def tag(case):
        return f"{case[0][:-3]}_{case[1] or 'none'}"

    def env(case, real):
        extra = {"OUTPUT_DIR": str(tmp / "out" / tag(case)), "DRY_RUN": "1"}
        if case[1]:
            extra["PROTOCOL"] = case[1]
        suffix = "real" if real else "replayed"
        environment = script_env(tmp, data_dir, tmp / f"{tag(case)}.{suffix}.processes",
                                 **extra)
        if not real:
            environment.update(PYTHON=str(stand_in), SCRIPT_CALL=str(tmp / tag(case)))
        return environment

    def run(case, real=False):
        proc = subprocess.run(["bash", str(SWEEPS / case[0])], cwd=tmp, env=env(case, real),
                              capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
        return proc

    def logged(case, suffix):
        log = tmp / f"{tag(case)}.{suffix}.processes"
        return log.read_text().splitlines() if log.exists() else []

    with ThreadPoolExecutor(max_workers=4) as pool:
        scripts = list(pool.map(run, CASES))
        real = dict(zip(REAL_DRY_RUNS, pool.map(lambda case: run(case, real=True),
                                                 REAL_DRY_RUNS)))
    calls = []
    for case, proc in zip(CASES, scripts):
        assert proc.returncode == 0, (case, proc.stderr[-3000:])
        base = tmp / tag(case)
        argv = base.with_suffix(".argv").read_bytes().decode().split("\0")[:-1]
        pairs = (item.split("=", 1) for item in
                 base.with_suffix(".env").read_bytes().decode().split("\0") if item)
        environment = {k: v for k, v in pairs if k != "SCRIPT_CALL"}
        calls.append({"argv": argv, "env": environment,
                      "cwd": base.with_suffix(".cwd").read_text().strip()})
    (tmp / "calls.json").write_text(json.dumps(calls))
    (tmp / "replay.py").write_text(REPLAY)
    runner = subprocess.run(
        [sys.executable, str(tmp / "replay.py"), str(tmp / "calls.json"),
         str(tmp / "results.json")], cwd=tmp, capture_output=True, text=True,
        timeout=SCRIPT_TIMEOUT_S, env=script_env(tmp, data_dir, tmp / "replay.processes"))
    assert runner.returncode == 0, runner.stderr[-3000:]
    results = json.loads((tmp / "results.json").read_text())
    return {case: (SimpleNamespace(**result), tmp / "out" / tag(case), SimpleNamespace(
        argv=call["argv"], processes=logged(case, "replayed"),
        real=(real[case], logged(case, "real")) if case in real else None))
        for case, call, result in zip(CASES, calls, results)}


def train_commands(stdout: str) -> list:
    """The train args of every job command a dry run printed."""
    from dg_plugins.scripts.train import build_parser

    parser = build_parser()
    jobs = []
    for line in stdout.splitlines():
        words = shlex.split(line) if " -m dg_plugins.scripts.train " in line else []
        if words:
            assert words[1:3] == ["-m", "dg_plugins.scripts.train"], line
            jobs.append(parser.parse_args(words[3:]))
    return jobs


def total(stdout: str) -> tuple[int, int]:
    match = re.search(r"^Total: (\d+) jobs, (\d+) training steps", stdout, re.MULTILINE)
    assert match, stdout[-2000:]
    return int(match.group(1)), int(match.group(2))


def test_every_script_is_covered():
    assert len(SCRIPTS) >= 17, SCRIPTS
    for setting in ps.SETTINGS.values():
        assert (REPO / setting.script).is_file(), setting.script
        assert f"reproduce {setting.name}\n" in (REPO / setting.script).read_text()
    for name in SCRIPTS:
        assert 'source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"' in \
            (SWEEPS / name).read_text(), f"{name} does not follow sweeps/_common.sh"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1] or 'offline'}")
def test_dry_run_lists_jobs_and_launches_nothing(case, dry_runs):
    proc, out, started = dry_runs[case]
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert not out.exists(), f"a dry run created {out}"
    # the script hands the interpreter one command, reproduce's listing, which starts nothing
    assert started.argv[:2] == ["-m", "dg_plugins.scripts.reproduce"], started.argv
    assert started.processes == [], f"a dry run started {started.processes}"
    if started.real is not None:  # run wholly as a user runs it: the replay's output, and
        real, processes = started.real  # the one Python process it started is reproduce
        assert (real.returncode, real.stdout, real.stderr) == (
            proc.returncode, proc.stdout, proc.stderr)
        assert processes and all("dg_plugins.scripts.reproduce" in p for p in processes), \
            processes
    n_jobs, steps = total(proc.stdout)
    jobs = train_commands(proc.stdout)
    assert n_jobs == len(jobs) > 0 and steps > 0
    assert all(j.eval_splits == "selection" for j in jobs)  # the knob EVAL_SPLITS's default
    assert "Dry run: nothing launched or written." in proc.stdout
    if not any(j.label_fraction is not None for j in jobs):  # UDG steps come from epochs
        assert steps == sum(j.steps for j in jobs)


#: A forwards count as the dry runs print it: training, evaluation with selection, with all.
FORWARDS = (r"train ([\d,]+|unknown); evaluation ([\d,]+|unknown) \(selection\) / "
            r"([\d,]+|unknown) \(all\)")


def image_forwards(stdout: str):
    """``(per job, per sweep call, total)`` image forwards a dry run printed, each a
    ``(train, selection, all)`` triple of ints (None: unknown)."""
    def triples(pattern):
        return [tuple(None if v == "unknown" else int(v.replace(",", "")) for v in m.groups())
                for m in re.finditer(pattern, stdout, re.MULTILINE)]

    totals = triples(rf"^Total image forwards: {FORWARDS}")
    assert len(totals) == 1, stdout[-2000:]
    return triples(rf"^  \S.*\): {FORWARDS}"), triples(rf"^\d+ jobs, image forwards: {FORWARDS}"), \
        totals[0]


def column_sums(triples) -> tuple:
    return tuple(None if any(t[i] is None for t in triples) else sum(t[i] for t in triples)
                 for i in range(3))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1] or 'offline'}")
def test_dry_run_prints_every_jobs_image_forwards_and_their_total(case, dry_runs):
    """Under DRY_RUN=1 every script prints each job's image forwards (training; evaluation with
    --eval_splits selection and all) with the definition, a sum per sweep call and in total;
    the totals are the sums of the job lines, and selection evaluates less than all (it skips
    the training environments' in-splits)."""
    from dg_plugins.reproduce import FORWARDS_DEFINITION

    proc, _, _ = dry_runs[case]
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs, calls, totals = image_forwards(proc.stdout)
    assert len(jobs) == total(proc.stdout)[0]
    assert column_sums(jobs) == column_sums(calls) == totals
    assert FORWARDS_DEFINITION in proc.stdout
    for train, selection, every in jobs:
        assert train > 0
        assert (selection is None) == (every is None)
        if every is not None:
            assert 0 < selection < every


def test_image_forwards_of_a_small_listing_match_a_hand_count(tmp_path, capsys):
    """Two sweep calls on the built-in RotatedMNIST5k (environments of 834, 834, 833, 833, 833,
    833 digits; holdout 0.2: out-splits of int(0.2 n) = 166, 996 in all), counted by hand:

    * ERM, test environment 5, 101 steps, a record at steps 0, 50, 100 (3), 16 per domain x 5
      sources: train 3 x 16 x 5 x 101 = 24,240; evaluation all 3 x 5,000 = 15,000, selection
      (every out-split, the target's in-split: 833 - 166 = 667) 3 x 1,663 = 4,989;
    * ERM with one pooled batch of 512, test environment 0, 9 steps, records at 0 and 8: the
      sources' in-splits pool 668 + 4 x 667 = 3,336 images, an epoch is ceil(3,336 / 512) = 7
      steps whose last holds 3,336 - 6 x 512 = 264, so 9 steps train on 3,336 + 2 x 512 = 4,360
      images: train 13,080; evaluation all 2 x 5,000 = 10,000, selection 2 x (996 + 668) =
      3,328."""
    from dg_plugins import reproduce

    base = ["launch", "--datasets", "RotatedMNIST5k", "--algorithms", "ERM", "--data_dir",
            "builtin", "--output_dir", str(tmp_path / "out"), "--n_trials", "1", "--n_hparams",
            "1", "--checkpoint_freq", "50"]
    assert reproduce.main(["--dry_run_sweeps", *base, "--test_env_sets", "5", "--steps", "101",
                           "--hparams", '{"batch_size": 16}', "::", *base,
                           "--test_env_sets", "0", "--steps", "9", "--hparams",
                           '{"batch_size": 512, "batch_sampling": "pooled"}']) == 0
    jobs, calls, totals = image_forwards(capsys.readouterr().out)
    assert jobs == calls == [(24_240, 4_989, 15_000), (13_080, 3_328, 10_000)]
    assert totals == (37_320, 8_317, 25_000)
    assert not (tmp_path / "out").exists()


def test_list_forwards_gives_every_setting_from_the_recorded_counts(capsys):
    """``reproduce --list --forwards``: one row per setting and protocol from the recorded
    full-size counts. By hand for dmg_pacs under DomainBed's protocol (48 jobs: 2 backbones x
    DMG, ERM x 4 targets x 3 trials; 21 per domain x 3 sources x 5001 steps; a record every 300
    steps and the last: 18 records of PACS's 9,991 images): train 48 x 3 x 63 x 5001 =
    45,369,072, evaluation with all 48 x 18 x 9,991 = 8,632,224."""
    from dg_plugins import reproduce

    assert reproduce.main(["--list", "--forwards"]) == 0
    out = capsys.readouterr().out
    rows = {tuple(cells[0:3]): cells for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| setting"))}
    assert set(rows) == {(s.name, s.script, p) for s in ps.SETTINGS.values()
                         for p in s.protocols}
    row = rows[("dmg_pacs", "sweeps/dmg_pacs_paper.sh", "domainbed")]
    assert row[3:5] == ["48", "45.4M"] and row[6] == "8.6M"
    for cells in rows.values():
        if "unknown" not in cells[5]:
            assert float(cells[5].rstrip("M").replace(",", "")) < \
                float(cells[6].rstrip("M").replace(",", ""))
    unknown = [line for line in out.splitlines() if line.startswith("unknown evaluation")]
    assert all("TerraIncognita" in line for line in unknown), unknown


#: A GPU-hours line as the dry runs print it: selection, all, the device, what is left out.
GPU_HOURS = (r"([\d,]+\.\d) \(selection\) / ([\d,]+\.\d) \(all\) on ([^;\n]+)(?:; left out: (.+))?"
             r"|not measured on ([^(\n]+) \((.+)\)")


def gpu_hours(stdout: str):
    """``(per sweep call, total)`` GPU-hours a dry run printed, each ``(selection, all, device,
    left out)`` (``None, None, device, left out`` where nothing is estimated)."""
    def found(prefix):
        out = []
        for m in re.finditer(rf"^{prefix}(?:{GPU_HOURS})$", stdout, re.MULTILINE):
            g = m.groups()
            out.append((float(g[0].replace(",", "")), float(g[1].replace(",", "")), g[2], g[3])
                       if g[0] else (None, None, g[4], g[5]))
        return out

    totals = found(r"Total GPU-hours \(estimate\): ")
    assert len(totals) == 1, stdout[-3000:]
    return found(r"\d+ jobs, GPU-hours \(estimate\): "), totals[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1] or 'offline'}")
def test_dry_run_prints_gpu_hours_with_their_device(case, dry_runs):
    """Under DRY_RUN=1 every script prints its estimated GPU-hours per sweep call and in total,
    with the device the step times were measured on and how the estimate is made; the total is
    the sum of the calls (each rounded to 0.1), and whatever is left out is named."""
    from dg_plugins.reference import gpu_times

    proc, _, _ = dry_runs[case]
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls, total = gpu_hours(proc.stdout)
    times = gpu_times.load()
    assert len(calls) == len(image_forwards(proc.stdout)[1])
    assert {c[2] for c in calls} == {total[2]} == {times.device}
    assert f"GPU-hours: an estimate from {times.source()}," in proc.stdout
    if total[0] is None:
        assert all(c[0] is None for c in calls)
    else:
        for i in (0, 1):
            estimated = [c[i] for c in calls if c[i] is not None]
            assert abs(sum(estimated) - total[i]) <= 0.05 * (len(estimated) + 1) + 1e-9
        assert total[0] <= total[1]
    left_out = {name for c in calls if c[3] for name in c[3].split(", ")}
    assert left_out == set(total[3].split(", ") if total[3] else ())
    for name in left_out:
        assert re.search(rf"^  left out of the GPU-hours: {re.escape(name)}: "
                         r"(not measured|unknown), ", proc.stdout, re.MULTILINE), name


def test_gpu_hours_of_a_small_listing_match_a_hand_count(tmp_path, capsys):
    """Two sweep calls on PACS (the recorded image counts: no data under --data_dir), one job each,
    long enough for a 0.1-hour resolution: ERM on ResNet-18, 32 per domain x 3 sources x
    1,000,001 steps, and on ResNet-50 with 16 per domain x 500,001 steps. Each job's GPU seconds
    are its training images (its printed training forwards / 3) x its network's measured step
    time per image (a step of 32 x 2 images: the training batch scales it), plus its printed
    evaluation forwards / the measured evaluation rate; a network without a measured step (the
    MNIST CNN) is left out and named."""
    from dg_plugins.reference import gpu_times
    from dg_plugins import reproduce

    times = gpu_times.load()
    base = ["launch", "--datasets", "PACS", "--algorithms", "ERM", "--data_dir",
            str(tmp_path / "none"), "--output_dir", str(tmp_path / "out"), "--n_trials", "1",
            "--n_hparams", "1", "--test_env_sets", "0", "--checkpoint_freq", "100000"]
    assert reproduce.main(["--dry_run_sweeps", *base, "--steps", "1000001", "--hparams",
                           '{"resnet18": true, "batch_size": 32}', "::", *base, "--steps",
                           "500001", "--hparams", '{"resnet18": false, "batch_size": 16}']) == 0
    out = capsys.readouterr().out
    jobs, _, _ = image_forwards(out)
    assert [j[0] for j in jobs] == [3 * 32 * 3 * 1_000_001, 3 * 16 * 3 * 500_001]
    calls, total = gpu_hours(out)
    want = []
    for (train, selection, every), label in zip(jobs, ("ERM ResNet-18", "ERM ResNet-50")):
        step = times.step_ms[label] / 1000 / (times.batch_per_domain * times.source_domains)
        want.append([(train / 3 * step + evaluation / times.eval_images_per_second) / 3600
                     for evaluation in (selection, every)])
    assert want[0][0] > 10 and want[1][0] > 4  # training dominates: 11.3 and 4.9 hours
    for (selection, every, device, left_out), hours in zip(calls, want):
        assert (device, left_out) == (times.device, None)
        assert abs(selection - hours[0]) <= 0.05 and abs(every - hours[1]) <= 0.05
    assert abs(total[0] - want[0][0] - want[1][0]) <= 0.05
    assert not (tmp_path / "out").exists()

    assert reproduce.main(["--dry_run_sweeps", "launch", "--datasets", "RotatedMNIST5k",
                           "--algorithms", "ERM", "--data_dir", "builtin", "--output_dir",
                           str(tmp_path / "out"), "--n_trials", "1", "--n_hparams", "1",
                           "--test_env_sets", "0", "--steps", "11"]) == 0
    calls, total = gpu_hours(capsys.readouterr().out)
    assert total == calls[0] == (None, None, times.device,
                                 "ERM MNIST CNN, RotatedMNIST5k evaluation")

    # images of another size than the measured 224x224 (the image_size hparam): left out
    assert reproduce.main(["--dry_run_sweeps", *base, "--steps", "11", "--hparams",
                           '{"resnet18": true, "image_size": 64}']) == 0
    out = capsys.readouterr().out
    assert gpu_hours(out)[1] == (None, None, times.device, "ERM ResNet-18, PACS evaluation")
    assert "ERM ResNet-18: not measured, measured at 224x224 only, not 64x64" in out, out


def header(script: str) -> str:
    """The comment lines at the top of a script, without their ``#``."""
    lines = []
    for line in (SWEEPS / script).read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines)


@pytest.mark.parametrize("case", [c for c in CASES if c[1]], ids=lambda c: f"{c[0]}-{c[1]}")
def test_dry_run_warns_of_what_a_real_run_would_miss_and_the_header_names_it(case, dry_runs):
    """With empty download caches, offline, on data without PACS's split lists: a paper script's
    dry run ends with one warning per missing prerequisite, each with its fix, and the script's
    header names each kind."""
    proc, _, _ = dry_runs[case]
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    text = header(case[0])
    if any("pretrained weights for" in line for line in warnings):
        assert "'{\"pretrained\": false}'" in text and "HPARAMS=" in text, text
    lists = [line for line in warnings if "official split lists" in line]
    if lists:
        assert "PACS_splits" in text
        assert all("-m dg_plugins.scripts.download --data_dir " in line
                   and line.endswith(" PACS_splits") for line in lists), lists
    if any("CLIP weights" in line for line in warnings):
        assert "CLIP_CHECKPOINT=" in text and any("--clip_checkpoint" in line for line in warnings)
    if warnings:
        assert "a real run would launch nothing" in warnings[-1]
    setting = PAPER_SCRIPTS[case[0]]
    if case == ("dmg_pacs_paper.sh", "release"):  # both backbones and the lists, at once
        assert [w for w in warnings if "resnet18" in w] and [w for w in warnings if "resnet50" in w]
        assert lists
    if setting.name.startswith("dismae") or setting.name == "mpbm_digits":  # random init
        assert not [w for w in warnings if "pretrained weights" in w]


def test_headers_name_the_downloads_each_script_needs():
    """Each paper script's header gives the downloader's command for every dataset of the setting
    (and PACS's split lists where a protocol reads them), or the local files it needs."""
    from dg_plugins.download.sources import download_command

    for name, setting in PAPER_SCRIPTS.items():
        text = header(name)
        datasets = list(dict.fromkeys(d for p in setting.protocols.values()
                                      for d in p.datasets.value))
        official = any(run.hparams.get("data_split", ps.Value(None, "")).value == "official"
                       for p in setting.protocols.values() for run in p.runs)
        command = download_command(datasets + (["PACS_splits"] if official else []), "DATA_DIR")
        if command is None:
            assert "DATA_DIR/digits/" in text, name
        else:
            assert command in text, (name, command)


def expected_test_envs(protocol: ps.Protocol, dataset: str) -> list[list[int]]:
    n = len(catalog.DATASET_ENVIRONMENTS[dataset])
    spec = protocol.test_envs.value
    if spec == "single_test_envs":
        return [[i] for i in range(n)]
    if spec == "single_source":
        return [[j for j in range(n) if j != i] for i in range(n)]
    return [list(s) for s in spec]


def expected_epoch_steps(protocol, hp, dataset, test_envs, fake_counts) -> tuple[int, int]:
    """Steps and checkpoint frequency of an epoch-based job, computed here from the table: the
    official split sizes, or the fake data's counts with DomainBed's holdout."""
    n = len(catalog.DATASET_ENVIRONMENTS[dataset])
    sources = [e for e in range(n) if e not in test_envs]
    if hp.get("data_split") == "official":
        sizes = [ps.OFFICIAL_TRAIN_SIZES[dataset].value[e] for e in sources]
    else:
        holdout = protocol.holdout_fraction.value if protocol.holdout_fraction else 0.2
        sizes = [fake_counts[dataset][e] - int(fake_counts[dataset][e] * holdout)
                 for e in sources]
    assert hp["batch_sampling"] == "pooled"
    per_epoch = math.ceil(sum(sizes) / hp["batch_size"])
    return protocol.epochs.value * per_epoch, per_epoch


@pytest.mark.parametrize("case", [c for c in CASES if c[1]], ids=lambda c: f"{c[0]}-{c[1]}")
def test_paper_jobs_carry_the_table(case, dry_runs, data):
    _, fake_counts = data
    proc, out, _ = dry_runs[case]
    assert proc.returncode == 0, proc.stderr[-3000:]
    setting = PAPER_SCRIPTS[case[0]]
    protocol = setting.protocols[case[1]]
    jobs = train_commands(proc.stdout)
    root = out / protocol.name
    seen = {}
    for job in jobs:
        folder = os.path.relpath(os.path.dirname(job.output_dir), root)
        group = next(g for g in protocol.groups if (g.folder or ".") == folder)
        run = next(r for r in protocol.runs if job.algorithm in r.algorithms)
        expected = {k: v.value for k, v in {**group.hparams, **run.hparams}.items()}
        # the job's --hparams hold exactly the table's values, and train resolves them
        assert json.loads(job.hparams or "{}") == expected
        resolved = H.job_hparams(job.algorithm, job.dataset, job.hparams_seed, job.trial_seed,
                                 job.hparams)
        assert {k: resolved[k] for k in expected} == expected
        assert job.dataset in protocol.datasets.value
        assert job.data_dir == str(data[0])
        holdout = protocol.holdout_fraction.value if protocol.holdout_fraction else 0.2
        assert job.holdout_fraction == holdout
        if protocol.epochs is not None:
            steps, freq = expected_epoch_steps(protocol, expected, job.dataset, job.test_envs,
                                               fake_counts)
            assert (job.steps, job.checkpoint_freq) == (steps, freq)
        elif "udg_ft_epochs" in protocol.sweep_flags:
            assert job.steps is None
            assert job.checkpoint_freq == protocol.checkpoint_freq[job.dataset].value
        else:
            assert job.steps == protocol.steps[job.dataset].value
            assert job.checkpoint_freq == protocol.checkpoint_freq[job.dataset].value
        flags = {k: v.value for k, v in protocol.sweep_flags.items()}
        if "label_fractions" in flags:
            assert job.label_fraction in flags["label_fractions"]
        for name in ("udg_pretrain_epochs", "udg_ft_epochs", "udg_split"):
            assert getattr(job, name) == flags.get(name)
        if protocol.alignment:
            assert job.alignment_scores == str(root / "alignment_scores" / f"{job.dataset}.csv")
            assert job.alignment_preset == protocol.alignment["preset"].value
        else:
            assert job.alignment_scores is None
        key = (folder, job.algorithm, job.dataset)
        seen.setdefault(key, set()).add((tuple(job.test_envs), job.trial_seed, job.hparams_seed,
                                         job.label_fraction))
    # every (folder, algorithm, dataset) of the table, with every test set, trial and hparams seed
    want = {}
    for group in protocol.groups:
        for run in protocol.runs:
            for algorithm in run.algorithms:
                for dataset in protocol.datasets.value:
                    fractions = protocol.sweep_flags.get("label_fractions")
                    want[(group.folder or ".", algorithm, dataset)] = {
                        (tuple(t), trial, seed, fraction)
                        for t in expected_test_envs(protocol, dataset)
                        for trial in range(protocol.n_trials.value)
                        for seed in range(protocol.n_hparams.value)
                        for fraction in (fractions.value if fractions else [None])}
    assert seen == want
    # the tables: the setting's selection and paper rows, per folder
    for group in protocol.groups:
        folder = root / group.folder if group.folder else root
        line = next(line for line in proc.stdout.splitlines()
                    if line.startswith("-- tables:") and f"--input_dir {folder} " in line)
        words = shlex.split(line.split(":", 1)[1])
        assert words[words.index("--selection") + 1:words.index("--paper")] == \
            list(protocol.selections.value)
        assert list(group.paper_keys) == words[words.index("--paper") + 1:][:len(group.paper_keys)]
    if protocol.alignment:
        for dataset in protocol.datasets.value:
            line = next(line for line in proc.stdout.splitlines()
                        if line.startswith("-- score:") and f"--dataset {dataset} " in line)
            words = shlex.split(line.split(":", 1)[1])
            for name, value in protocol.alignment.items():
                if name != "preset":
                    assert words[words.index(f"--{name}") + 1] == value.value


def test_epoch_steps_follow_the_data_on_disk_or_the_recorded_counts(dry_runs, data):
    """DMG's DomainNet release derives its steps from the images under DATA_DIR (fake here) and
    says so; PACS's official split from the recorded list sizes (112 steps per epoch without
    art_painting: 7137 images / 64)."""
    proc, _, _ = dry_runs[("dmg_domainnet_paper.sh", "release")]
    assert f"counted on disk in {data[0] / 'domain_net'}" in proc.stdout
    proc, _, _ = dry_runs[("dmg_pacs_paper.sh", "release")]
    assert "7137 training images (2107+1499+3531; official split lists" in proc.stdout
    assert "= 112 steps per epoch x 150 epochs = 16800 steps" in proc.stdout


def run_cli(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=python_path(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dg_plugins.scripts.reproduce", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def refusal(capsys, *args) -> tuple[int, str]:
    """``reproduce ARGS`` called in this process: its exit status and what it printed to stderr."""
    from dg_plugins.reproduce import cli as reproduce_cli

    capsys.readouterr()
    try:
        code = reproduce_cli.main(list(args))
    except SystemExit as stop:  # argparse's errors
        code = stop.code
    return code, capsys.readouterr().err


def test_bad_input_is_refused_with_one_line(tmp_path, capsys):
    """The command refuses bad input with exit status 2 and a message (the first as a subprocess,
    the others in this process: the messages are the subject)."""
    proc = run_cli("mpbm_pacs", "--protocol", "release", "--data_dir", str(tmp_path), "--dry_run")
    assert proc.returncode == 2 and "mpbm_pacs has no 'release' protocol" in proc.stderr
    code, err = refusal(capsys, "gmoe_domainbed", "--data_dir", str(tmp_path), "--dry_run",
                        "--checkpoint_freq", "5")
    assert code == 2 and "--checkpoint_freq: set by the setting's table" in err
    code, err = refusal(capsys, "dmg_pacs", "--data_dir", str(tmp_path), "--dry_run", "--steps",
                        "5")
    assert code == 2 and "counts its lengths in epochs; give --epochs" in err
    code, err = refusal(capsys, "dmg_pacs", "--data_dir", str(tmp_path), "--dry_run",
                        "--test_envs", "0,1")
    assert code == 2 and "--test_envs 0,1: not among dmg_pacs's" in err
    code, err = refusal(capsys, "dmg_pacs", "--data_dir", str(tmp_path), "--dry_run",
                        "--clip_checkpoint", "x")
    assert code == 2 and "dmg_pacs scores no images" in err
    code, err = refusal(capsys, "gmoe_domainbed", "--data_dir", str(tmp_path), "--dry_run",
                        "--datasets", "MNIST")
    assert code == 2 and "not in gmoe_domainbed's datasets" in err
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(SWEEPS / "dmg_pacs_paper.sh"), "/data"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "takes sweep flags as arguments" in proc.stderr
    assert not (tmp_path / "sweep_output").exists()


def test_listing_matches_the_sweeps_own_dry_run(tmp_path, capsys):
    """reproduce lists exactly the jobs and commands that sweep launch --dry_run prints for the
    same call, with the pass-through flags applied (here --n_trials 1)."""
    from dg_plugins import reproduce
    from dg_plugins.scripts import sweep as sweep_cli

    setting = ps.get_setting("gmoe_single_source_domainnet")
    plan = reproduce.plan_setting(setting, setting.protocols["release"], data_dir=str(tmp_path),
                                  output_dir=str(tmp_path / "out"), extra=["--n_trials", "1"])
    for call in plan.calls:
        cost = reproduce.call_cost(call.argv)
        assert {job.train_args["trial_seed"] for job in cost.jobs} == {0}
        capsys.readouterr()
        assert sweep_cli.main(call.argv + ["--dry_run"]) == 0
        printed = [line for line in capsys.readouterr().out.splitlines()
                   if " -m dg_plugins.scripts.train " in line]
        assert printed == [job.command() for job in cost.selected]
    assert not (tmp_path / "out").exists()


def test_steps_per_epoch():
    assert ps.steps_per_epoch([2107, 1499, 3531], 64, "pooled") == 112  # ceil(7137 / 64)
    assert ps.steps_per_epoch([128, 64], 64, "pooled") == 3
    assert ps.steps_per_epoch([128, 64], 32, "per_domain") == 2
    with pytest.raises(ValueError, match="batch_sampling"):
        ps.steps_per_epoch([1], 1, "other")
    assert in_split_size(2048, 0.2) == 2048 - 409


def test_the_quick_start_continues_after_an_interruption(tmp_path, data):
    """A reduced quick start (part 1, ERM and DMG) stopped by Ctrl-C in the middle of its first
    job (held after step 3 by the test's gate until the signal): the terminal got one line per
    job, not their settings (those are in out.txt), and the message names the whole command to
    run again, not part 1's sweep; the job never started is Not launched. The same command again
    resumes the job from its checkpoint (no step recorded twice), runs the other and prints a
    table with the held-out domain's accuracy."""
    from support.job_gate import gate_vars, released

    out, gate = tmp_path / "quickstart", tmp_path / "gate"
    gate.mkdir()
    log = tmp_path / "processes"
    env = script_env(tmp_path, data[0], log, OUTPUT_DIR=str(out), PARTS="1", ALGORITHMS="ERM DMG",
                     STEPS="6", **gate_vars(gate, step=3))
    env["PYTHONPATH"] += os.pathsep + str(REPO / "tests")
    command = ["bash", str(SWEEPS / "offline_quickstart.sh")]
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             preexec_fn=as_from_a_terminal)
    try:
        with released(gate):
            deadline = time.monotonic() + 120
            while not (gate / "waiting").exists():
                assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
                time.sleep(0.05)
            os.killpg(first.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
            first_out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode != 0, first_out
    assert not (out / ".launchers").exists()  # the launcher's claim went with it
    (job,) = [p for p in out.iterdir() if p.is_dir()]  # the other job: no folder, Not launched
    assert not (job / "done").exists(), first_out
    assert "HParams:" not in first_out and "HParams:" in (job / "out.txt").read_text()
    assert re.search(r"\[1/2\] started: (ERM|DMG) on RotatedMNIST5k, test envs 5", first_out)
    assert re.search(r"\[1/2\] interrupted \(exit code 130\) in \d+ s: stopped: stopped by "
                     r"SIGINT after step 3", first_out), first_out
    rerun = (f"PYTHON={sys.executable} OUTPUT_DIR={out} PARTS=1 ALGORITHMS='ERM DMG' STEPS=6 "
             f"bash {SWEEPS / 'offline_quickstart.sh'}")
    assert ("To continue, run the whole command again (finished jobs are skipped; interrupted "
            f"jobs resume from their last checkpoint):\n  {rerun}\n") in first_out, first_out
    assert "dg_plugins.scripts.sweep launch" not in first_out
    # the time estimate: rough before the first job (nothing measured), saying how it was made
    rough = ("quick start: 2 jobs, 0 done; rough estimate: about 10 s for the 2 left (12 training "
             "steps at 0.05 s per step: the whole quick start (15 jobs, 1,715 training steps) "
             "took 87 s on 2 idle CPU cores, results/benchmarks.md; nothing is measured on this "
             "machine yet). Updated as jobs finish.\n")
    assert rough in first_out and first_out.index(rough) < first_out.index("[1/2] started")
    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=240)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "2 jobs: 0 done, 1 incomplete, 1 not launched." in second.stdout
    assert "(1 of them are Incomplete and will run with --resume.)" in second.stdout
    assert "HParams:" not in second.stdout and len(re.findall(r"\] done in ", second.stdout)) == 2
    assert rough in second.stdout  # nothing measured in this run yet; then the measured rate
    assert re.search(r"\n  quick start: 1/2 jobs done, about \d+ (s|min)( \d+ s)? left \([0-9.e-]+ s "
                     r"per training step, measured over the 1 job\(s\) finished in this run; "
                     r"start-up and evaluation included\)\n", second.stdout), second.stdout
    assert "\n  quick start: 2/2 jobs done.\n" in second.stdout
    assert all((p / "done").exists() for p in out.iterdir() if p.is_dir())
    steps = [json.loads(line)["step"] for line in (job / "results.jsonl").read_text().splitlines()]
    assert steps == [0, 5], steps
    averages = re.search(r"Averages, model selection method: training-domain validation set\n"
                         r".*\nERM +(\d+\.\d) \+/- 0\.0", second.stdout)
    assert averages, second.stdout[-3000:]


def test_the_quick_start_as_the_readme_runs_it_names_the_readme_command_to_rerun(tmp_path):
    """Run as the README's command 1 runs it (from the clone, PYTHON=.venv/bin/python, nothing
    else), the quick start hands its sweeps that command to suggest after an interruption (here
    a stand-in .venv/bin/python prints what it was handed)."""
    (tmp_path / "sweeps").symlink_to(SWEEPS)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$DG_SWEEP_RERUN_COMMAND"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in (
        "OUTPUT_DIR", "LAUNCHER", "PARTS", "ALGORITHMS", "STEPS", "DRY_RUN")}
    env["PYTHON"] = ".venv/bin/python"
    proc = subprocess.run(["bash", "sweeps/offline_quickstart.sh"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.splitlines()) == {
        "python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e . && "
        "PYTHON=.venv/bin/python bash sweeps/offline_quickstart.sh"}


def test_reproduce_runs_a_setting_and_its_epochs_match_the_jobs(tmp_path, monkeypatch, capsys):
    """A real run of a small epoch-based setting (ERM on Debug28, pooled batches of 8, 2 epochs):
    the steps and checkpoint frequency derived from the recorded image counts are the
    job's own epoch (its record at the checkpoint after one epoch says epoch 1.0), the run is
    recorded beside the sweep, and the tables follow."""
    import dg_plugins.datasets  # noqa: F401
    from dg_plugins.registry import DATASETS
    from dg_plugins import reproduce

    counts = tuple(len(env) for env in DATASETS.get("Debug28")("builtin", [0], {}))
    monkeypatch.setitem(ps.DATASET_SIZES, "Debug28", ps.Value(counts, "counted in test"))
    v = ps.Value
    protocol = ps.Protocol(
        name="release", summary="pooled ERM for 2 epochs", datasets=v(("Debug28",), "t"),
        test_envs=v(((0,),), "t"),
        runs=(ps.Run(("ERM",), {"batch_size": v(8, "t"), "batch_sampling": v("pooled", "t"),
                                 "lr_schedule": v("exp_epoch", "t"), "lr_decay": v(0.5, "t")}),),
        groups=(ps.Group("", (), "CNN"),), n_trials=v(1, "t"), n_hparams=v(1, "t"),
        selections=v(("iid",), "t"), epochs=v(2, "t"))
    monkeypatch.setitem(ps.SETTINGS, "tiny", ps.Setting("tiny", "none.sh", "test", "none",
                                                         {"release": protocol}))
    out = tmp_path / "out"
    code = reproduce.main(["tiny", "--data_dir", "builtin", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed[-3000:]
    per_epoch = math.ceil(sum(n - int(n * 0.2) for n in counts[1:]) / 8)
    assert per_epoch > 1  # the records below at distinct steps
    (job,) = [p for p in (out / "release").iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (job / "results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, per_epoch, 2 * per_epoch - 1]
    assert records[1]["epoch"] == 1.0
    assert records[0]["args"]["checkpoint_freq"] == per_epoch
    assert (job / "done").exists()
    assert "tiny (none.sh), protocol release" in (out / "release" / "reproduce.txt").read_text()
    assert re.search(r"\| ERM +\| +\d+\.\d", printed), printed[-2000:]


@pytest.mark.parametrize("outcome", ["failed", "stopped"])
def test_reproduce_hands_the_settings_jobs_to_one_launcher_call(tmp_path, data, monkeypatch,
                                                                capsys, outcome):
    """dmg_pacs (DomainBed's protocol, one held-out domain, one trial) has a sweep per backbone
    folder: reproduce hands both sweeps' jobs to the launcher in one call (here a registered
    stand-in that runs nothing: one job fails, or a stop signal arrives), each job in its own
    sweep's folder. A failure is reported as a sweep reports it, with the reproduce command that
    continues every sweep and, per sweep with Incomplete jobs, its own delete_incomplete line
    (no "<your flags>" template anywhere); the tables follow. A stop starts nothing more (exit 128 + signal, no tables); the job the
    signal kept from starting is Not launched again. Claims and the environment are left clean."""
    import shlex
    import signal as signals

    from dg_plugins import reproduce
    from dg_plugins.registry import LAUNCHERS
    from dg_plugins.sweep import actions
    from dg_plugins.sweep import jobs as claims
    from dg_plugins.sweep.processes import JobsFailed, LaunchInterrupted, command_output_dir

    calls = []

    def stand_in(commands):
        calls.append(list(commands))
        by_folder = {os.path.basename(os.path.dirname(command_output_dir(c))): c
                     for c in commands}
        if outcome == "stopped":
            raise LaunchInterrupted(signals.SIGTERM, [by_folder["resnet18"]],
                                    [by_folder["resnet50"]])
        (Path(command_output_dir(by_folder["resnet50"])) / "done").write_text("")
        raise JobsFailed([by_folder["resnet18"]], len(commands), exit_codes=[1])

    LAUNCHERS.register("one_queue_stand_in", stand_in)
    monkeypatch.delenv(actions.RERUN_ENV, raising=False)
    argv = ["dmg_pacs", "--protocol", "domainbed", "--data_dir", str(data[0]), "--output_dir",
            str(tmp_path / "out"), "--command_launcher", "one_queue_stand_in", "--algorithms",
            "ERM", "--test_envs", "3", "--steps", "1", "--hparams", '{"pretrained": false}',
            "--n_trials", "1"]
    try:
        code = reproduce.main(argv)
    finally:
        LAUNCHERS.unregister("one_queue_stand_in")
    out = capsys.readouterr().out
    root = tmp_path / "out" / "domainbed"
    (commands,) = calls
    assert sorted(os.path.dirname(command_output_dir(c)) for c in commands) == [
        str(root / "resnet18"), str(root / "resnet50")]
    assert "-- one queue: the 2 jobs of the 2 sweep(s) above, handed to the one_queue_stand_in " \
        "launcher at once\n" in out
    rerun = shlex.join([sys.executable, "-m", "dg_plugins.scripts.reproduce", *argv])
    if outcome == "stopped":
        assert code == 143, out
        assert "Sweep stopped by SIGTERM: 1 job(s) interrupted, 1 not started.\n" in out
        assert f"run the whole command again (finished jobs are skipped; interrupted jobs " \
            f"resume from their last checkpoint):\n  {rerun}\n" in out
        assert "Stopped; rerun the same command to continue" in out and "-- tables" not in out
        assert [p.name for p in (root / "resnet50").iterdir() if not p.name.startswith(".")] \
            == []  # unlaunched: Not launched again
    else:
        assert code == 1, out
        assert "Sweep: 1 of 2 launched jobs failed" in out
        assert f"run the whole command again (finished jobs are skipped; a job resumes from its " \
            f"last checkpoint, if any):\n  {rerun}\n" in out
        assert "<your flags>" not in out
        deletes = [line.strip() for line in out.splitlines()
                   if " -m dg_plugins.scripts.sweep delete_incomplete " in line]
        assert len(deletes) == 1 and f"--output_dir {root / 'resnet18'} " in deletes[0], out
        assert "--resume" not in deletes[0] and "--skip_confirmation" not in deletes[0]
        assert out.count("-- tables of dmg_pacs") == 2
    assert actions.RERUN_ENV not in os.environ
    assert claims.live_claims(str(root / "resnet18")) == claims.live_claims(
        str(root / "resnet50")) == []


def test_a_paper_script_hands_its_own_command_to_continue(tmp_path):
    """A paper script tells reproduce, for the lines that say how to continue a stopped or
    failed run, the command that ran it: the knobs the user set and its arguments, quoted as
    typed back (here a stand-in PYTHON prints what it was handed)."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "$DG_SWEEP_RERUN_COMMAND"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in KNOBS + ("DG_SWEEP_RERUN_COMMAND",)}
    env.update(PYTHON=str(python), DATA_DIR="/data", HPARAMS='{"pretrained": false}',
               LAUNCHER="multi_gpu")
    proc = subprocess.run(["bash", str(SWEEPS / "dmg_pacs_paper.sh"), "--n_hparams", "2"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"PYTHON={python} DATA_DIR=/data LAUNCHER=multi_gpu HPARAMS="
                           f"'{{\"pretrained\": false}}' bash {SWEEPS / 'dmg_pacs_paper.sh'} "
                           "--n_hparams 2\n")
