"""collect_results names every job folder it leaves out and why, and every cell that averages
jobs of different settings (issue 58, items 5 and 8; dg_plugins.collect.notes)."""

import hashlib
import json
import subprocess
import sys

import pytest

from test_collect_results import block, cells, checkpoints, run, write_job

RESULTS = [(0.6, 0.70), (0.9, 0.75), (0.8, 0.80)]  # (source validation, target) per checkpoint


def real_job(root, dataset, algorithm, test_env, n_envs, steps=300, trial=0, results=RESULTS,
             done=True, **extra):
    """A job folder as a sweep writes it: named by the md5 of its args, DomainBed's full args
    (``extra`` overrides or adds some) in every record; returns the folder's name."""
    records = checkpoints(dataset, algorithm, [test_env], n_envs, results, trial=trial)
    args = {**records[0]["args"], "checkpoint_freq": None, "data_dir": "/data",
            "holdout_fraction": 0.2, "hparams": None, "save_model_every_checkpoint": False,
            "seed": trial, "skip_model_save": False, "steps": steps,
            "task": "domain_generalization", "uda_holdout_fraction": 0, **extra}
    name = hashlib.md5(json.dumps(args, sort_keys=True).encode()).hexdigest()
    if "output_dir" not in extra:
        args["output_dir"] = f"sweep/{name}"
    write_job(root, name, [dict(record, args=args) for record in records], done=done)
    return name


def pacs_sweep(root, algorithms=("ERM", "DMG"), **extra):
    """Every test environment of PACS for each algorithm, one trial: {(algorithm, env): job}."""
    return {(algorithm, t): real_job(root, "PACS", algorithm, t, 4, **extra)
            for algorithm in algorithms for t in range(4)}


def collect(input_dir, *flags):
    command = [sys.executable, "-m", "dg_plugins.scripts.collect_results", "--input_dir",
               str(input_dir), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


IID = "Dataset: PACS, model selection method: training-domain validation set"


def test_every_left_out_job_folder_is_named_with_its_reason(tmp_path, capsys):
    root = tmp_path / "sweep"
    jobs = pacs_sweep(root)
    empty, absent, unreadable, garbage, running = (
        root / jobs[key] for key in (("DMG", 0), ("DMG", 1), ("DMG", 2), ("ERM", 3), ("ERM", 2)))
    (empty / "results.jsonl").write_text("")  # what the user saw: a done job, no record
    (absent / "results.jsonl").unlink()
    (unreadable / "results.jsonl").unlink()
    (unreadable / "results.jsonl").mkdir()
    (garbage / "results.jsonl").write_text('{"args": {"algorithm": "ERM", "da\n')
    (running / "results.jsonl").write_text("")  # not done: running, no record yet
    (running / "done").unlink()

    result = collect(root, "--no_save")
    assert result.returncode == 0, result.stderr
    notes = result.stderr.splitlines()
    assert (f"note: job folder {empty.name} is left out of the tables: done, but its "
            "results.jsonl is empty (the job wrote no record); delete the folder and relaunch "
            "the sweep to run the job again.") in notes
    assert (f"note: job folder {absent.name} is left out of the tables: done, but it has no "
            "results.jsonl; delete the folder and relaunch the sweep to run the job again."
            ) in notes
    assert (f"note: job folder {unreadable.name} is left out of the tables: its results.jsonl "
            "cannot be read (Is a directory); make it readable, or delete the folder and "
            "relaunch the sweep.") in notes
    assert (f"note: job folder {garbage.name} is left out of the tables: no line of its "
            "results.jsonl is a usable record (1 line); the warnings above name the bad "
            "lines.") in notes
    assert not any(running.name in note for note in notes if "left out" in note)
    assert f"note: 7 of 8 jobs done (1 running or incomplete: {running.name})" in result.stderr
    # the tables still print, with what is left: ERM at A and C, DMG at S
    rows = [cells(line)[0] for line in block(result.stdout, IID)]
    assert rows[:3] == ["Algorithm", "ERM", "DMG"] and rows[3].startswith("left out: ")

    # the same notes with every output format
    for fmt in ("latex", "markdown", "csv"):
        status, out, err = run(capsys, "--input_dir", root, "--no_save", "--format", fmt)
        assert status == 0 and out
        assert [n for n in err.splitlines() if "left out" in n] == [
            n for n in notes if "left out" in n]


def test_several_folders_of_one_reason_and_a_sweep_with_no_record_left(tmp_path, capsys):
    root = tmp_path / "sweep"
    jobs = sorted(pacs_sweep(root, algorithms=("ERM",)).values())
    for job in jobs:
        (root / job / "results.jsonl").write_text("\n")
    status, out, err = run(capsys, "--input_dir", root)
    assert status == 1 and out == ""
    assert err.splitlines() == [
        f"note: 4 job folders are left out of the tables, each done, but its results.jsonl is "
        f"empty (the job wrote no record): {', '.join(jobs)}; delete each folder and relaunch the "
        "sweep to run the job again.",
        f"error: no records in {str(root)!r}: expected {root}/<job>/results.jsonl files (one "
        "folder level)"]


def test_a_relaunch_with_other_steps_in_one_cell_is_noted(tmp_path, capsys):
    root = tmp_path / "sweep"
    pacs_sweep(root, steps=300)
    # the user relaunched test environment A with --steps 600: a new folder, the same group
    relaunched = real_job(root, "PACS", "ERM", 0, 4, steps=600,
                          results=[(0.6, 0.40), (0.95, 0.45), (0.7, 0.50)])
    result = collect(root, "--no_save", "--selection", "iid")
    assert result.returncode == 0, result.stderr
    assert relaunched in {p.name for p in root.iterdir()}
    assert ("note: PACS, ERM: a cell mixes jobs of different settings, test environment A: "
            "--steps 300 (1 job), --steps 600 (1 job) (DomainBed groups runs by dataset, "
            "algorithm, test environments, hparams_seed and trial_seed only); collect each "
            "setting from a folder of its own to compare them.") in result.stderr.splitlines()
    assert "DMG" not in result.stderr  # its cells hold one setting each

    # two settings at once, and another trial of the same cell: counted per value
    real_job(root, "PACS", "ERM", 0, 4, steps=600, trial=1, checkpoint_freq=50)
    _, _, err = run(capsys, "--input_dir", root, "--no_save", "--selection", "iid")
    assert ("note: PACS, ERM: a cell mixes jobs of different settings, test environment A: "
            "--steps 300 no --checkpoint_freq (1 job), --steps 600 no --checkpoint_freq (1 job), "
            "--steps 600 --checkpoint_freq 50 (1 job) (DomainBed") in err


def test_test_environments_of_other_settings_are_noted_for_avg(tmp_path, capsys):
    root = tmp_path / "sweep"
    for t in range(4):
        real_job(root, "PACS", "ERM", t, 4, steps=300 if t < 2 else 600,
                 hparams=None if t < 2 else '{"lr": 0.001}')
    _, _, err = run(capsys, "--input_dir", root, "--no_save", "--selection", "iid")
    assert ("note: PACS, ERM: its test environments ran with different settings, which the "
            "tables combine (the Avg column, the Averages table, leave-one-domain-out's runs on "
            "pairs): no --hparams --steps 300 at A, C; --hparams '{\"lr\": 0.001}' --steps 600 "
            "at P, S.") in err.splitlines()


@pytest.mark.parametrize("first, second", [
    ({"hparams": '{"lr": 0.001, "batch_size": 8}'}, {"hparams": '{"batch_size":8,"lr":1e-3}'}),
    ({"hparams": None}, {"hparams": "{}"}),
    ({"holdout_fraction": 0.2}, {"holdout_fraction": None}),
    ({"data_dir": "/a"}, {"data_dir": "/b"}),  # where the data is, not what is computed
    ({"output_dir": "x"}, {"output_dir": "y"}),
], ids=["hparams-spelling", "empty-hparams", "default-holdout", "data_dir", "output_dir"])
def test_equal_settings_spelled_otherwise_are_not_noted(tmp_path, capsys, first, second):
    root = tmp_path / "sweep"
    real_job(root, "PACS", "ERM", 0, 4, **first)
    real_job(root, "PACS", "ERM", 0, 4, trial=1, **second)
    status, _, err = run(capsys, "--input_dir", root, "--no_save", "--selection", "iid")
    assert status == 0 and "settings" not in err
