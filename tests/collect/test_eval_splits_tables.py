"""``--eval_splits selection`` gives the tables of ``all``: the same sweep run both ways, as a
user runs it (sweep with the local launcher, then collect_results), prints identical tables,
notes and learning checks with ours and with DomainBed's collect_results (that one needs a
DomainBed checkout in DOMAINBED_ROOT, plus wilds, which it imports): DomainBed's default sweep,
for leave-one-domain-out (its jobs include test-environment pairs), and the normal sweep of
single test environments (its jobs, a subset). Skipped splits print no X and no note, also for
a dataset the catalog does not know (its environments are counted on the out-splits)."""

import importlib.util
import json
import os
import shutil
import subprocess

import pytest

from dg_plugins.domainbed.bridge import unpatched_script_command
from dg_plugins.scripts import collect_results

from support.helpers import read_records
from support.processes import command_env, run

DOMAINBED_ROOT = os.environ.get("DOMAINBED_ROOT")
SWEEP = "dg_plugins.scripts.sweep"
#: The sweeps: DomainBed's default on Debug28 (DomainBed knows it, so its collect_results reads
#: the folders too: 3 single test environments and 3 pairs), and its single-test-environment jobs.
SWEEPS = ("loo", "normal")
MODES = ("all", "selection")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_splits")
    out = {}
    for mode in MODES:
        folder = out["loo", mode] = root / f"loo_{mode}"
        code, output = run(SWEEP, "launch", "--datasets", "Debug28", "--algorithms", "ERM",
                           "--n_trials", "1", "--n_hparams", "1", "--steps", "3",
                           "--checkpoint_freq", "2", "--hparams", '{"batch_size": 8}',
                           "--data_dir", "builtin", "--output_dir", folder,
                           "--command_launcher", "local", "--skip_confirmation",
                           "--eval_splits", mode, env=command_env(), timeout=300)
        assert code == 0, output
        normal = out["normal", mode] = root / f"normal_{mode}"
        for job in folder.iterdir():
            if len(read_records(job)[0]["args"]["test_envs"]) == 1:
                shutil.copytree(job, normal / job.name)
    return out


def ours(capsys, folder, *flags):
    status = collect_results.main(["--input_dir", str(folder), *flags])
    out, err = capsys.readouterr()
    assert status == 0, err
    return out, err


@pytest.mark.parametrize("name", SWEEPS)
def test_the_same_job_folders_and_values_for_every_key_selection_reads(folders, name):
    """The flag is not part of a job's identity (same folder names both ways); each selection
    record holds every key selection reads, equal to the ``all`` record's, and lists them."""
    jobs = {mode: sorted(p.name for p in folders[name, mode].iterdir() if p.is_dir())
            for mode in MODES}
    assert jobs["all"] == jobs["selection"] and len(jobs["all"]) == (6 if name == "loo" else 3)
    skipped = 0
    for job in jobs["all"]:
        full = read_records(folders[name, "all"] / job)
        chosen = read_records(folders[name, "selection"] / job)
        assert len(full) == len(chosen) == 2  # steps 0 and 2
        for a, s in zip(full, chosen):
            tests = s["args"]["test_envs"]
            assert s["evaluated_splits"] == (
                [f"env{t}_in" for t in sorted(tests)] + ["env0_out", "env1_out", "env2_out"])
            assert all(s[k] == a[k] for k in s if k.endswith("_acc"))
            skipped += sum(f"env{i}_in_acc" not in s for i in range(3))
    assert skipped > 0


@pytest.mark.parametrize("name", SWEEPS)
def test_our_tables_notes_and_learning_check_are_identical(folders, name, capsys):
    tables = {mode: ours(capsys, folders[name, mode]) for mode in MODES}
    assert tables["all"] == tables["selection"]
    out, err = tables["selection"]
    selections = out.count("model selection method")
    assert selections == 6  # three methods, a dataset table and Averages each
    if name == "loo":  # every cell has a number: no X, and no note
        assert " X " not in out and err == ""
    else:  # leave-one-domain-out lacks its pair runs, and says so, both ways alike
        assert " X " in out and "leave-one-domain-out scores test environment" in err
    checks = {mode: ours(capsys, folders[name, mode], "--learning_check") for mode in MODES}
    assert checks["all"] == checks["selection"]
    assert checks["all"][0].count(" ERM Debug28 ") == (6 if name == "loo" else 3)


def test_an_unknown_dataset_gets_every_column_without_x(folders, tmp_path, capsys):
    """Records of a dataset the catalog does not know are labelled by their environment count:
    with the training in-splits skipped it is still counted (on the out-splits), so the tables
    have every column, no X and no note, as with every split."""
    printed = {}
    for mode in MODES:
        copy = tmp_path / mode
        shutil.copytree(folders["loo", mode], copy)
        for path in copy.glob("*/results.jsonl"):
            records = [json.loads(line) for line in path.read_text().splitlines()]
            for record in records:
                record["args"]["dataset"] = "MyData"
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        printed[mode] = ours(capsys, copy)
    out, err = printed["selection"]
    assert printed["all"] == printed["selection"]
    assert "Algorithm             0                     1                     2  " in out
    assert " X " not in out and err == ""


@pytest.mark.skipif(not DOMAINBED_ROOT, reason="DOMAINBED_ROOT is not set (path to a DomainBed "
                    "checkout)")
@pytest.mark.skipif(importlib.util.find_spec("wilds") is None,
                    reason="DomainBed needs the wilds package (pip install wilds)")
@pytest.mark.parametrize("name", SWEEPS)
def test_domainbeds_collect_results_prints_the_same_tables(folders, name, capsys):
    printed = {}
    for mode in MODES:
        cmd, env = unpatched_script_command(
            "collect_results", ["--input_dir", str(folders[name, mode])], DOMAINBED_ROOT)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                              cwd=folders[name, mode].parent)
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed[mode] = proc.stdout
    assert printed["all"] == printed["selection"]
    assert printed["selection"] == ours(capsys, folders[name, "selection"])[0]


def test_domainbeds_sweep_without_the_training_in_splits_gives_its_tables(shared_fixtures,
                                                                         tmp_path, capsys):
    """DomainBed's own sweep (VLCS, singles and pairs, 200 records), each record stripped of what
    ``--eval_splits selection`` does not evaluate (its training environments' in-splits): ours
    still prints DomainBed's tables for it byte for byte, every method included."""
    sweep = tmp_path / "sweep"
    shutil.copytree(shared_fixtures / "domainbed_sweep_data", sweep)
    dropped = 0
    for path in sweep.glob("*/results.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            for i in range(4):
                if i not in record["args"]["test_envs"]:
                    del record[f"env{i}_in_acc"]
                    dropped += 1
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out, _ = ours(capsys, sweep)
    assert dropped > 200
    assert out == (shared_fixtures / "domainbed_sweep_data.expected_tables.txt").read_text()
