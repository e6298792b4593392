"""What a launch costs, stated before ``Are you sure? (y/n)`` and in ``--dry_run``: training
steps, image forwards, the GPU time from the step times measured on an H200, and the time on this
machine from a few steps timed in a child process (:mod:`dg_plugins.sweep.costs`). The lines'
form is checked, never the speed of the machine."""

from __future__ import annotations

import io
import random
import re
import subprocess
import sys

from support.image_tree import draw_image
from support.processes import command_env

from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep import costs as estimate

#: The README's image-folder sweep ("Your own image folder"), as a user copies it.
README_SWEEP = """python -m dg_plugins.scripts.sweep launch --datasets ImageFolder --data_dir TREE \\
    --algorithms ERM DMG --output_dir out/sweep --command_launcher local \\
    --single_test_envs --n_hparams 1 --n_trials 3 --eval_splits selection"""


def make_tree(root, domains=("indoor", "outdoor"), classes=("cat", "dog"), per_class=5):
    """``root/<domain>/<class>/<k>.jpg``: a small image tree (32x32 JPEGs)."""
    rng = random.Random(0)
    for d, domain in enumerate(domains):
        for c, name in enumerate(classes):
            folder = root / domain / name
            folder.mkdir(parents=True)
            for k in range(per_class):
                draw_image(rng, c, d, 32).save(folder / f"{k}.jpg")
    return root


def fake_resnet50_weights(hf_home) -> None:
    """The hub cache holding timm's resnet50.ram_in1k (the sweep's check finds the ImageNet
    ResNet-50 cached; nothing loads it here)."""
    repo = hf_home / "hub" / "models--timm--resnet50.ram_in1k"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snapshot / "model.safetensors").write_bytes(b"not read")


def test_the_readme_image_folder_sweep_states_its_cost_on_a_cpu_before_asking(tmp_path):
    """The README's command, copied as is on a machine without a GPU, answered "n": before the
    prompt it states the jobs' steps and image forwards, the measured H200 estimate and an
    estimate for this machine from steps timed here; nothing is launched."""
    make_tree(tmp_path / "TREE")
    fake_resnet50_weights(tmp_path / "hf")
    argv = README_SWEEP.replace("\\\n", " ").replace("python -m ", "").split()
    assert argv[0] == "dg_plugins.scripts.sweep"
    env = command_env(HF_HOME=str(tmp_path / "hf"), CUDA_VISIBLE_DEVICES="",
                      DG_SWEEP_ESTIMATE_TIMEOUT="900")
    proc = subprocess.run([sys.executable, "-m", *argv], input="n\n", text=True, cwd=tmp_path,
                          env=env, capture_output=True, timeout=1000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before, asked, after = proc.stdout.partition("Are you sure? (y/n) ")
    assert asked and after.strip() == "Nevermind!", proc.stdout[-3000:]
    assert not (tmp_path / "out").exists()
    lines = before.splitlines()
    assert "About to launch 12 jobs." in lines
    # 2 domains, each the target once, x 2 algorithms x 3 trials; 5,001 steps of 32 images of
    # the one source domain, 3 forwards an image
    cost = [i for i, line in enumerate(lines) if line.startswith("Cost of the 12 jobs")]
    assert cost, before
    assert re.fullmatch(r"Cost of the 12 jobs: 60,012 training steps; image forwards: train "
                        r"5,761,152, evaluation [1-9][\d,]* \(eval_splits selection\)",
                        lines[cost[0]]), lines[cost[0]]
    gpu = [line for line in lines if line.startswith("GPU time")]
    assert len(gpu) == 1 and re.fullmatch(
        r"GPU time \(estimate, from the step times measured on an NVIDIA H200, one job at a "
        r"time\): about \d.*", gpu[0]), gpu
    here = [line for line in lines if line.startswith("Estimated on this machine")]
    assert len(here) == 1, before
    assert re.fullmatch(
        r"Estimated on this machine \(cpu, no GPU visible\): about \d[^(]* for 12 jobs, one at "
        r"a time \(ERM ResNet-50: [\d.]+ (s|min \d+ s) a step of 32 images \(timed on 2\); "
        r"DMG ResNet-50: [\d.]+ (s|min \d+ s) a step of 32 images \(timed on 2\); timed here "
        r"on random images and scaled per image, evaluation included; loading, start-up and "
        r"checkpoints not counted\)", here[0]), here[0]
    assert lines.index(here[0]) > cost[0]


def debug_argv(tmp_path, *extra):
    return ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
            "--n_trials", "1", "--steps", "5", "--output_dir", str(tmp_path / "out"),
            "--data_dir", "builtin", "--command_launcher", "dummy", *extra]


def test_a_dry_run_states_the_cost_and_short_jobs_are_not_timed(tmp_path, capsys):
    assert sweep_cli.main(debug_argv(tmp_path, "--dry_run")) == 0
    out = capsys.readouterr().out.splitlines()
    assert "Dry run: nothing is launched." in out
    # Debug28: 3 environments, 6 test-environment sets; 5 steps each
    assert re.fullmatch(r"Cost of the 6 jobs: 30 training steps; image forwards: train [\d,]+, "
                        r"evaluation [\d,]+ \(eval_splits all\)", out[-3]), out[-3:]
    assert out[-2] == ("GPU time: not estimated (no step time measured on an NVIDIA H200 for "
                       "these jobs; left out: Debug28 evaluation (not measured: evaluation "
                       "measured at 224x224 only), ERM MNIST CNN (not measured: no benchmark gpu "
                       "row))")
    assert re.fullmatch(r"Time on this machine \(.*\): not timed, the jobs are short \(30 "
                        r"training steps in all\)", out[-1]), out[-1]
    assert not (tmp_path / "out").exists()


def test_skip_confirmation_leaves_the_estimate_out(tmp_path, capsys):
    assert sweep_cli.main(debug_argv(tmp_path, "--skip_confirmation", "--dry_run")) == 0
    out = capsys.readouterr().out
    assert "Cost of the" not in out and out.splitlines()[-1].startswith(sys.executable)
    assert sweep_cli.main(debug_argv(tmp_path, "--skip_confirmation")) == 0
    out = capsys.readouterr().out
    assert "Cost of the" not in out and "Launched 6 jobs!" in out


def test_an_estimate_that_fails_or_runs_out_of_time_says_so_and_stops_nothing(
        tmp_path, capsys, monkeypatch):
    (tmp_path / "slow_estimate.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    monkeypatch.setattr(estimate, "CHILD_MODULE", "slow_estimate")
    monkeypatch.setenv(estimate.TIMEOUT_ENV, "2")
    assert sweep_cli.main(debug_argv(tmp_path)) == 0
    out = capsys.readouterr().out
    assert ("(the cost estimate stopped after 2 s, $DG_SWEEP_ESTIMATE_TIMEOUT: what it had not "
            "printed by then is left out)\nAre you sure? (y/n) ") in out
    assert "Launched 6 jobs!" in out

    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    monkeypatch.setattr(estimate, "CHILD_MODULE", "dg_plugins.no_such_module")
    assert sweep_cli.main(debug_argv(tmp_path, "--output_dir", str(tmp_path / "out2"))) == 0
    out = capsys.readouterr().out
    assert re.search(r"\(the cost estimate failed, exit status 1: .*No module named "
                     r"dg_plugins.no_such_module.*; the launch does not depend on it\)\nAre you "
                     r"sure\? \(y/n\) Nevermind!", out), out[-2000:]

    monkeypatch.setenv(estimate.TIMEOUT_ENV, "0")  # off
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert sweep_cli.main(debug_argv(tmp_path, "--output_dir", str(tmp_path / "out3"))) == 0
    assert "cost estimate" not in capsys.readouterr().out


def test_reproduce_counts_the_generic_image_folder(tmp_path, capsys):
    """``reproduce --dry_run_sweeps`` (the paper scripts' DRY_RUN) counts an ImageFolder sweep's
    images in --data_dir itself (it stopped on a KeyError before)."""
    from dg_plugins import reproduce

    tree = make_tree(tmp_path / "TREE")
    assert reproduce.main(["--dry_run_sweeps", "launch", "--datasets", "ImageFolder",
                           "--data_dir", str(tree), "--algorithms", "ERM", "--output_dir",
                           str(tmp_path / "out"), "--single_test_envs", "--n_hparams", "1",
                           "--n_trials", "1", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    # per job: 10 steps x 32 images x 3; each of its 2 records (steps 0 and 9) evaluates with
    # selection the source's out-split (2 of its 10 images) and the target's in and out splits
    # (10 images), with all every split (20 images)
    assert "2 jobs, image forwards: train 1,920; evaluation 48 (selection) / 80 (all)" in out
