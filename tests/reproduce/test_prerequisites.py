"""Before launching anything, ``reproduce`` (the body of every paper script in ``sweeps/``) checks
what every sweep of the setting needs (data folder, datasets, PACS's split lists, pretrained and
CLIP weights) and names each missing piece with its fix: a real run then launches nothing (exit
2), a dry run lists its jobs and warns (exit 0). Run as a user does (``bash sweeps/<script>``),
offline with empty download caches; the tests whose subject is one message call the command
``sweeps/dmg_pacs_paper.sh`` runs (its ``reproduce`` main, with the flags the script passes) in
this process (:func:`reproduce_here`)."""

from __future__ import annotations

import json

import pytest

from support.image_tree import make_pacs_sample
from support.paper_runs import run_script
from support import release_data

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("prerequisites")


@pytest.fixture(scope="module")
def pacs_without_lists(tmp_path_factory):
    return make_pacs_sample(tmp_path_factory.mktemp("pacs"))


def problems(text: str, kind: str) -> list[str]:
    return [line[len(kind) + 2:] for line in text.splitlines() if line.startswith(f"{kind}: ")]


class Here:
    """What :func:`reproduce_here` returns: a :class:`support.paper_runs.ScriptRun`'s fields."""

    def __init__(self, returncode, stdout, stderr, output_dir):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.output_dir = output_dir

    def report(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n" \
               f"{self.stderr[-4000:]}"


def reproduce_here(tmp, data_dir, *, tag, capsys, monkeypatch, epochs=None, hparams=None,
                   dry_run=False, setting="dmg_pacs", datasets=None,
                   clip_checkpoint=None) -> Here:
    """The ``reproduce SETTING`` call ``bash sweeps/<script>.sh`` makes (dmg_pacs_paper.sh:
    dmg_pacs, ipoop_domainbed.sh: ipoop; its flags for DATA_DIR, OUTPUT_DIR under ``tmp/<tag>``,
    DATASETS, EPOCHS, CLIP_CHECKPOINT, HPARAMS, DRY_RUN; the local launcher, ``--eval_splits
    selection``), its main run in this process, offline, where launching a sweep or scoring
    fails the test."""
    from dg_plugins.reproduce import cli

    def launched(*args, **kwargs):
        raise AssertionError("reproduce started a sweep or a process")

    monkeypatch.setattr(cli, "launch_queue", launched)
    monkeypatch.setattr(cli.subprocess, "run", launched)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DG_PLUGINS_OFFLINE", "1")
    out = tmp / tag
    argv = [setting, "--data_dir", str(data_dir), "--output_dir", str(out),
            "--command_launcher", "local", "--eval_splits", "selection"]
    if datasets is not None:
        argv += ["--datasets", *datasets]
    if epochs is not None:
        argv += ["--epochs", epochs]
    if clip_checkpoint is not None:
        argv += ["--clip_checkpoint", clip_checkpoint]
    if hparams is not None:
        argv += ["--hparams", json.dumps(hparams)]
    if dry_run:
        argv.append("--dry_run")
    capsys.readouterr()
    code = cli.main(argv)
    stdout, stderr = capsys.readouterr()
    return Here(code, stdout, stderr, out)


@pytest.fixture(scope="module")
def real(tmp, pacs_without_lists):
    return run_script("dmg_pacs_paper.sh", tmp, pacs_without_lists, tag="real",
                      timeout=TIMEOUT_S)


def test_a_real_run_names_every_missing_piece_and_launches_nothing(real, pacs_without_lists):
    """PACS present, no split lists, no cached weights: the default (release) protocol of
    dmg_pacs_paper.sh names the lists and both backbones' weights at once, each with its fix,
    and starts no sweep, no job and no launcher process, and writes nothing."""
    data, run = pacs_without_lists, real
    assert run.returncode == 2, run.report()
    errors = problems(run.stderr, "error")
    lists = [e for e in errors if "official split lists" in e]
    assert len(lists) == 1 and lists[0].endswith(
        f"python -m dg_plugins.scripts.download --data_dir {data} PACS_splits"), errors
    for backbone in ("resnet18", "resnet50"):
        (line,) = [e for e in errors if f"torchvision {backbone} " in e]
        assert "pretrained_path" in line and '"pretrained": false' in line
    assert len(errors) == 3, errors
    assert "Nothing was launched: 3 prerequisite(s) of dmg_pacs (release) missing" in run.stderr
    assert "-- sweep" not in run.stdout
    assert not run.started_anything(), run.processes
    assert not run.output_dir.exists()


def test_a_dry_run_lists_the_jobs_and_warns_of_the_same_pieces(tmp, pacs_without_lists, real):
    dry = run_script("dmg_pacs_paper.sh", tmp, pacs_without_lists, tag="dry", timeout=TIMEOUT_S,
                     DRY_RUN="1")
    assert dry.returncode == 0, dry.report()
    assert "Total: 48 jobs" in dry.stdout and "Dry run: nothing launched or written." in dry.stdout
    warnings = problems(dry.stderr, "warning")
    assert warnings[:-1] == problems(real.stderr, "error")
    assert warnings[-1] == ("3 prerequisite(s) of dmg_pacs (release) missing (above): a real run "
                            "would launch nothing until they are there.")
    assert not dry.started_anything() and not dry.output_dir.exists()


def test_nothing_missing_no_warning(tmp, tmp_path_factory, capsys, monkeypatch):
    data = release_data.pacs(tmp_path_factory.mktemp("complete"))
    dry = reproduce_here(tmp, data, tag="complete", capsys=capsys, monkeypatch=monkeypatch,
                         dry_run=True, hparams={"pretrained": False})
    assert dry.returncode == 0 and "warning" not in dry.stderr, dry.report()
    assert "Total: 48 jobs" in dry.stdout, dry.report()


def test_a_missing_data_folder_is_named(tmp, capsys, monkeypatch):
    absent = tmp / "no_such_folder"
    run = reproduce_here(tmp, absent, tag="absent", capsys=capsys, monkeypatch=monkeypatch,
                         hparams={"pretrained": False}, dry_run=True)
    assert run.returncode == 0, run.report()
    found = problems(run.stderr, "warning")
    assert found[0] == (f"the data folder {absent} (--data_dir, DATA_DIR) does not exist: point "
                        "it at the folder that holds the datasets, or download them there: "
                        f"python -m dg_plugins.scripts.download --data_dir {absent} PACS"), found
    assert [f for f in found if "PACS_splits" in f]  # the lists too
    assert not run.output_dir.exists()


def test_a_data_folder_that_is_the_datasets_own_names_the_one_meant(tmp, pacs_without_lists,
                                                                     capsys, monkeypatch):
    """DATA_DIR pointed at the PACS folder itself: one line names the folder meant, and neither
    PACS nor its lists are offered for download into the wrong folder; nothing is launched."""
    run = reproduce_here(tmp, pacs_without_lists / "PACS", tag="own_folder", capsys=capsys,
                         monkeypatch=monkeypatch, hparams={"pretrained": False})
    assert run.returncode == 2, run.report()
    assert problems(run.stderr, "error") == [
        f"PACS: --data_dir {pacs_without_lists / 'PACS'} is PACS's own folder, not the one "
        f"holding it (<data_dir>/PACS); did you mean --data_dir {pacs_without_lists}?"]
    assert not run.output_dir.exists()


def test_ip_oop_names_the_clip_weights_and_the_knob_for_a_local_copy(tmp, pacs_without_lists,
                                                                      capsys, monkeypatch):
    """The script itself; then its reproduce call with a CLIP_CHECKPOINT that is not there, in
    this process."""
    run = run_script("ipoop_domainbed.sh", tmp, pacs_without_lists, tag="clip",
                     timeout=TIMEOUT_S, DATASETS="PACS", HPARAMS='{"pretrained": false}')
    assert run.returncode == 2, run.report()
    (line,) = problems(run.stderr, "error")
    assert line.startswith("scoring images for IP/OOP (ViT-B-16 laion400m_e32): CLIP weights")
    assert line.endswith("With reproduce: --clip_checkpoint FILE (sweeps/*.sh: "
                         "CLIP_CHECKPOINT=FILE).")
    assert not run.started_anything() and not run.output_dir.exists()
    missing = tmp / "absent.bin"
    run = reproduce_here(tmp, pacs_without_lists, tag="clip_file", capsys=capsys,
                         monkeypatch=monkeypatch, setting="ipoop", datasets=["PACS"],
                         hparams={"pretrained": False}, clip_checkpoint=str(missing))
    assert run.returncode == 2, run.report()
    (line,) = problems(run.stderr, "error")
    assert f"--pretrained {str(missing)!r}: no such checkpoint file" in line
    assert not run.output_dir.exists()


# Errors that name what the user typed ------------------------------------------------------------

@pytest.fixture(scope="module")
def pacs_with_lists(tmp_path_factory):
    return release_data.pacs(tmp_path_factory.mktemp("pacs_lists"))


@pytest.mark.parametrize("dry_run", ["1", "0"])
def test_epochs_that_round_to_no_step_are_named_before_any_sweep(tmp, pacs_with_lists, dry_run,
                                                                 capsys, monkeypatch):
    """EPOCHS x the steps of an epoch (DMG's release: one pooled batch of 64 over the sample's
    official train lists, 1 step) rounds to 0 steps: one line names the product, the setting and
    the smallest EPOCHS that gives a step (0.51: 0.5 rounds to 0), before anything starts. A
    real run through the script itself, the dry run's reproduce call in this process."""
    if dry_run == "0":
        run = run_script("dmg_pacs_paper.sh", tmp, pacs_with_lists, tag=f"epochs_{dry_run}",
                         timeout=TIMEOUT_S, EPOCHS="0.03", DRY_RUN=dry_run,
                         HPARAMS='{"pretrained": false}')
        assert not run.started_anything(), run.processes
    else:
        run = reproduce_here(tmp, pacs_with_lists, tag=f"epochs_{dry_run}", capsys=capsys,
                             monkeypatch=monkeypatch, epochs="0.03", dry_run=True,
                             hparams={"pretrained": False})
    assert run.returncode == 2, run.report()
    assert run.stderr == (
        "error: EPOCHS 0.03 x 1 steps per epoch rounds to 0 steps for dmg_pacs (release), DMG on "
        "PACS (ResNet-18), test envs [0]: the smallest EPOCHS that gives one step is 0.51 "
        "(reproduce: --epochs)\n")
    assert run.stdout == "" and not run.output_dir.exists()


def test_the_smallest_epochs_named_gives_one_step(tmp, pacs_with_lists, capsys, monkeypatch):
    half = reproduce_here(tmp, pacs_with_lists, tag="epochs_half", capsys=capsys,
                          monkeypatch=monkeypatch, epochs="0.5", dry_run=True,
                          hparams={"pretrained": False})
    assert half.returncode == 2 and "the smallest EPOCHS that gives one step is 0.51" in \
        half.stderr, half.report()
    enough = reproduce_here(tmp, pacs_with_lists, tag="epochs_enough", capsys=capsys,
                            monkeypatch=monkeypatch, epochs="0.51", dry_run=True,
                            hparams={"pretrained": False})
    assert enough.returncode == 0, enough.report()
    assert "Total: 48 jobs, 48 training steps" in enough.stdout


def test_an_interpreter_without_torch_is_named_with_the_install_command(tmp, pacs_with_lists,
                                                                        tmp_path):
    """PYTHON runs dg_plugins from the checkout but cannot import torch (a ``torch`` that fails
    to import comes first on its path): one line names the interpreter and the command that
    installs the package into it, instead of a traceback; a real run and a dry run alike. So does
    an interpreter without any of the package's requirements, at the commands' first import."""
    import os
    import shlex
    import subprocess
    import sys

    from support.paper_runs import REPO

    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    path = ":".join(map(str, (fake.parent, tmp / "site", REPO)))
    exe, repo = shlex.quote(sys.executable), shlex.quote(str(REPO))
    for dry_run in ("0", "1"):
        run = run_script("dmg_pacs_paper.sh", tmp, pacs_with_lists, tag=f"no_torch_{dry_run}",
                         timeout=TIMEOUT_S, PYTHONPATH=path, DRY_RUN=dry_run)
        assert run.returncode == 2, run.report()
        assert run.stderr == (
            f"error: {exe} cannot import torch (No module named 'torch'), which dg_plugins "
            f"needs: install the package into it ({exe} -m pip install -e {repo}), or run the "
            "interpreter that has it (sweeps/*.sh: PYTHON=.venv/bin/python)\n")
        assert not run.started_anything() and not run.output_dir.exists()
    # An interpreter with none of the requirements (site-packages off, as a system Python): the
    # commands' first imports fail on numpy, named in one line, by the paper script and by sweep.
    bare = tmp_path / "bare_python"
    bare.write_text(f'#!/bin/sh\nexec {exe} -S "$@"\n')
    bare.chmod(0o755)
    needs_numpy = (f"error: {exe} cannot import numpy (No module named 'numpy'), which dg_plugins "
                   f"needs: install the package into it ({exe} -m pip install -e {repo}), or run "
                   "the interpreter that has it (sweeps/*.sh: PYTHON=.venv/bin/python)\n")
    run = run_script("dmg_pacs_paper.sh", tmp, pacs_with_lists, tag="bare", timeout=TIMEOUT_S,
                     PYTHON=str(bare))
    assert (run.returncode, run.stderr) == (2, needs_numpy), run.report()
    assert not run.output_dir.exists()
    sweep = subprocess.run([str(bare), "-m", "dg_plugins.scripts.sweep", "launch", "--datasets",
                            "Debug28", "--output_dir", str(tmp_path / "bare_sweep")],
                           capture_output=True, text=True, timeout=TIMEOUT_S,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert (sweep.returncode, sweep.stderr) == (2, needs_numpy), sweep.stdout + sweep.stderr
    run = run_script("dmg_pacs_paper.sh", tmp, pacs_with_lists, tag="no_python",
                     timeout=TIMEOUT_S, PYTHON="no-such-python3")
    assert run.returncode == 2 and run.stderr == (
        "error: PYTHON=no-such-python3 is not a command; point PYTHON at the interpreter that "
        "has dg_plugins installed, e.g. PYTHON=.venv/bin/python bash "
        "sweeps/dmg_pacs_paper.sh\n"), run.report()
