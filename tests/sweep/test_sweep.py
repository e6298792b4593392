"""Sweep enumeration, identity, command strings, states and the sweep CLI (``domainbed/scripts/sweep.py``)."""

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dg_plugins.sweep import actions
from dg_plugins.sweep import jobs as sweep_jobs
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.job.flags import train_command

DOMAINBED_KEYS = {"dataset", "algorithm", "test_envs", "holdout_fraction", "hparams_seed",
                  "data_dir", "task", "trial_seed", "seed"}


def debug_args(**overrides):
    kwargs = dict(n_trials=1, dataset_names=["Debug28"], algorithms=["ERM"], n_hparams_from=0,
                  n_hparams=1, steps=None, data_dir="/tmp/data", task="domain_generalization",
                  holdout_fraction=0.2, single_test_envs=False, hparams=None)
    kwargs.update(overrides)
    return sweep_jobs.make_args_list(**kwargs)


def cli(tmp_path, *extra, command="launch", launcher="dummy", n_trials="1"):
    """sweep CLI argv for Debug28/ERM, one hparams seed, output in tmp_path/out."""
    argv = [command, "--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
            "--n_trials", n_trials, "--output_dir", str(tmp_path / "out"),
            "--data_dir", str(tmp_path / "data"), "--skip_confirmation"]
    if launcher:
        argv += ["--command_launcher", launcher]
    return argv + list(extra)


def job_dirs(tmp_path):
    out = tmp_path / "out"
    return sorted(p.name for p in out.iterdir() if p.is_dir()) if out.is_dir() else []


# ---------------------------------------------------------------------------------------------
# Identity (Appendix C, fixtures)


def test_golden_job_folders():
    first, pair = debug_args()[:2]
    assert (first["test_envs"], first["seed"]) == ([0], 896409087)
    assert (pair["test_envs"], pair["seed"]) == ([0, 1], 2084338853)
    assert sweep_jobs.job_folder_name(first) == "c2795d74da15b21740c9af82b7158584"
    assert sweep_jobs.job_folder_name(pair) == "dd63953648534e3dfcb969a0c56698bd"
    assert sweep_jobs.SweepJob(first, "/out").output_dir == "/out/c2795d74da15b21740c9af82b7158584"


def test_golden_vlcs_job():
    jobs = sweep_jobs.make_args_list(1, ["VLCS"], ["ERM"], 1, 2, 1001, "/checkpoint/dlp/datasets_new",
                                "domain_generalization", 0.2, False, None)
    job = next(a for a in jobs if a["test_envs"] == [1, 2])
    assert job["seed"] == 360234358
    assert sweep_jobs.job_folder_name(job) == "0657090f9a83ff76efe083a104fde93a"


def test_fixture_folder_names_are_recomputed(shared_fixtures):
    """DomainBed's shipped test sweep (VLCS, ERM, 2 trials, hparams seeds 0-1, steps 1001) is
    exactly our enumeration, and each record's args hash to its folder."""
    root = shared_fixtures / "domainbed_sweep_data"
    folders = {p.name for p in root.iterdir() if p.is_dir()}
    enumerated = sweep_jobs.make_args_list(2, ["VLCS"], ["ERM"], 0, 2, 1001,
                                      "/checkpoint/dlp/datasets_new", "domain_generalization",
                                      0.2, False, None)
    assert {sweep_jobs.job_folder_name(a) for a in enumerated} == folders
    assert len(folders) == 40
    for folder in folders:
        record = json.loads((root / folder / "results.jsonl").open().readline())["args"]
        train_args = {k: record[k] for k in DOMAINBED_KEYS}
        train_args.update({k: record[k] for k in ("steps", "hparams") if record[k] is not None})
        assert sweep_jobs.job_folder_name(train_args) == folder


# ---------------------------------------------------------------------------------------------
# Enumeration


def test_test_env_combinations():
    assert sweep_jobs.test_env_combinations(4) == [[0], [0, 1], [0, 2], [0, 3], [1], [1, 2], [1, 3],
                                              [2], [2, 3], [3]]
    with pytest.raises(ValueError, match="--single_test_envs"):
        sweep_jobs.test_env_combinations(2)
    assert sweep_jobs.single_source_test_envs(3) == [[1, 2], [0, 2], [0, 1]]


def test_enumeration_counts_and_loop_order():
    args = debug_args(n_trials=2, n_hparams=3)
    assert len(args) == 36  # DomainBed's test_make_args_list: 2 * 3 * (3 + 3)
    order = [(a["trial_seed"], a["test_envs"], a["hparams_seed"]) for a in args]
    assert order[:4] == [(0, [0], 0), (0, [0], 1), (0, [0], 2), (0, [0, 1], 0)]
    assert order[18] == (1, [0], 0)
    assert all(set(a) == DOMAINBED_KEYS for a in args)
    assert len(debug_args(n_trials=2, n_hparams=3, single_test_envs=True)) == 18
    # dataset before algorithm, both inside trial
    two = debug_args(dataset_names=["Debug28", "Debug224"], algorithms=["ERM", "X"],
                     single_test_envs=True)
    assert [(a["dataset"], a["algorithm"]) for a in two[::3]] == [
        ("Debug28", "ERM"), ("Debug28", "X"), ("Debug224", "ERM"), ("Debug224", "X")]


def test_single_source_jobs():
    args = debug_args(n_trials=2, n_hparams=3, single_source=True)
    assert len(args) == 2 * 3 * 3
    assert [a["test_envs"] for a in args[::3][:3]] == [[1, 2], [0, 2], [0, 1]]
    one = args[0]
    assert one["seed"] == sweep_jobs.seed_hash("Debug28", "ERM", [1, 2], 0, 0)
    vlcs = sweep_jobs.make_args_list(1, ["VLCS"], ["ERM"], 0, 1, None, "d", "domain_generalization",
                                0.2, False, None, single_source=True)
    assert [a["test_envs"] for a in vlcs] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    with pytest.raises(ValueError, match="mutually exclusive"):
        debug_args(single_source=True, single_test_envs=True)


def test_optional_args_enter_the_hash_only_when_given():
    base = debug_args()[0]
    full = debug_args(steps=3, hparams='{"batch_size": 8}', checkpoint_freq=2,
                      uda_holdout_fraction=0.1)[0]
    assert set(full) - set(base) == {"steps", "hparams", "checkpoint_freq",
                                     "uda_holdout_fraction"}
    assert full["hparams"] == '{"batch_size": 8}'
    assert sweep_jobs.job_folder_name(full) != sweep_jobs.job_folder_name(base)


def test_unknown_dataset_lists_choices():
    with pytest.raises(ValueError, match="unknown dataset 'NoSuchData'.*choices: .*Debug28"):
        sweep_jobs.num_environments("NoSuchData")
    assert sweep_jobs.num_environments("VLCS") == 4


# ---------------------------------------------------------------------------------------------
# Commands and states


def test_command_string_matches_domainbed_format():
    job = sweep_jobs.SweepJob(debug_args()[0], "/out")
    domainbed_style = train_command(job.train_args, "domainbed.scripts.train", "python")
    assert domainbed_style == (
        "python -m domainbed.scripts.train --algorithm ERM --data_dir /tmp/data --dataset Debug28 "
        "--holdout_fraction 0.2 --hparams_seed 0 --output_dir /out/c2795d74da15b21740c9af82b7158584"
        " --seed 896409087 --task domain_generalization --test_envs 0 --trial_seed 0")
    assert job.command_str == domainbed_style.replace(
        "python -m domainbed.scripts.train", f"{shlex.quote(sys.executable)} -m "
                                             "dg_plugins.scripts.train")
    job = sweep_jobs.SweepJob(debug_args(hparams='{"batch_size": 8}')[1], "/my out")
    assert "--hparams '{\"batch_size\": 8}'" in job.command_str
    assert "--test_envs 0 1 " in job.command_str
    assert f"--output_dir '{job.output_dir}' " in job.command_str
    assert job.command(resume=True) == job.command_str + " --resume"


def test_job_states_and_str(tmp_path):
    job = sweep_jobs.SweepJob(debug_args()[0], str(tmp_path))
    assert job.state == sweep_jobs.NOT_LAUNCHED
    assert str(job) == f"Not launched: {job.output_dir} ('Debug28', 'ERM', [0], 0)"
    os.makedirs(job.output_dir)
    assert sweep_jobs.SweepJob(debug_args()[0], str(tmp_path)).state == sweep_jobs.INCOMPLETE
    Path(job.output_dir, "done").write_text("done")
    assert job.refresh_state() == sweep_jobs.DONE
    assert str(job).startswith("Done: ")
    assert sweep_jobs.summary_line([job]) == "1 jobs: 1 done, 0 incomplete, 0 not launched."


def test_launch_order_is_seeded(tmp_path):
    def order(seed, where):
        jobs = sweep_jobs.make_jobs(debug_args(n_hparams=3), str(tmp_path / where))
        return [c.split("--output_dir ")[1].split(" ")[0].rsplit("/", 1)[1]
                for c in actions.launch(jobs, lambda commands: None, seed=seed)]

    assert order(0, "a") == order(0, "b")
    assert order(0, "c") != order(1, "d")


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_dummy_launch_then_relaunch_skips(tmp_path, capsys):
    assert sweep_cli.main(cli(tmp_path, n_trials="2")) == 0
    out = capsys.readouterr().out
    assert out.count("Dummy launcher: ") == 12
    assert "12 jobs: 0 done, 0 incomplete, 12 not launched." in out
    assert "Launched 12 jobs!" in out
    assert len(job_dirs(tmp_path)) == 12
    assert sweep_cli.main(cli(tmp_path, n_trials="2")) == 0
    out = capsys.readouterr().out
    assert "12 jobs: 0 done, 12 incomplete, 0 not launched." in out
    assert "About to launch 0 jobs." in out and "Dummy launcher" not in out


def test_cli_delete_incomplete_keeps_done(tmp_path, capsys):
    sweep_cli.main(cli(tmp_path))
    done = job_dirs(tmp_path)[:2]
    for name in done:
        (tmp_path / "out" / name / "done").write_text("")
    assert sweep_cli.main(cli(tmp_path, command="delete_incomplete", launcher=None)) == 0
    out = capsys.readouterr().out
    assert "About to delete 4 jobs." in out and "Deleted 4 jobs!" in out
    assert job_dirs(tmp_path) == done


def test_cli_delete_all_touches_only_this_sweep(tmp_path, capsys):
    sweep_cli.main(cli(tmp_path))
    out = tmp_path / "out"
    (out / job_dirs(tmp_path)[0] / "done").write_text("")
    foreign = out / ("f" * 32)  # looks like a job folder, but not of this enumeration
    foreign.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "submitit_logs").mkdir()
    other_sweep = cli(tmp_path, "--steps", "5")  # same output_dir, different args
    sweep_cli.main(other_sweep)
    ours = {sweep_jobs.job_folder_name(a) for a in debug_args(data_dir=str(tmp_path / "data"))}
    kept = set(job_dirs(tmp_path)) - ours
    assert len(kept) == 6 + 2  # the --steps 5 sweep, the foreign folder, submitit_logs
    assert sweep_cli.main(cli(tmp_path, command="delete_all", launcher=None)) == 0
    assert "Deleted 6 jobs!" in capsys.readouterr().out
    assert set(job_dirs(tmp_path)) == kept
    assert {"f" * 32, "submitit_logs"} <= kept and (out / "notes.txt").exists()


def test_cli_resume_relaunches_incomplete_with_flag(tmp_path, capsys):
    sweep_cli.main(cli(tmp_path))
    names = job_dirs(tmp_path)
    (tmp_path / "out" / names[0] / "done").write_text("")
    for name in names[1:3]:
        (tmp_path / "out" / name).rmdir()  # -> Not launched again
    capsys.readouterr()
    assert sweep_cli.main(cli(tmp_path, "--resume")) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if line.startswith("Dummy launcher: ")]
    assert len(commands) == 5
    resumed = {c.split("--output_dir ")[1].split()[0].rsplit("/", 1)[1]
               for c in commands if c.endswith(" --resume")}
    assert resumed == set(names[3:])
    assert "(3 of them are Incomplete and will run with --resume.)" in out


def test_relaunch_says_how_to_continue_or_clear_incomplete_jobs(tmp_path, capsys):
    """A launch that finds Incomplete jobs (and no --resume) says how many, why they may be
    Incomplete, and gives the exact command lines that continue (--resume) or delete them."""
    argv = cli(tmp_path, "--steps", "5")
    sweep_cli.main(argv)
    names = job_dirs(tmp_path)
    (tmp_path / "out" / names[0] / "done").write_text("")
    (tmp_path / "out" / names[1] / "err.txt").write_text("error: a job that ran and failed\n")
    capsys.readouterr()
    assert sweep_cli.main(argv + ["--dry_run"]) == 0
    assert sweep_cli.main(argv) == 0
    out = capsys.readouterr().out
    head = f"{shlex.quote(sys.executable)} -m dg_plugins.scripts.sweep"
    resume = f"{head} {shlex.join(argv + ['--resume'])}"
    delete = f"{head} {shlex.join(['delete_incomplete'] + argv[1:])}".replace(
        " --skip_confirmation", "")  # deleting asks for confirmation
    for run in out.split("About to launch 0 jobs.\n")[1:]:  # the dry run, then the launch
        lines = run.splitlines()
        assert lines[0].startswith("Note: 5 job(s) are Incomplete")
        assert ("no live process holds it): 1 were interrupted or failed and 4 never started "
                "(an empty folder)") in lines[0]  # the dummy launcher started none
        assert lines[2] == f"    {resume}" and lines[4] == f"    {delete}"
    assert "--dry_run" not in out.split("About to launch 0 jobs.")[1]
    # the suggested commands do what they say
    capsys.readouterr()
    assert sweep_cli.main(shlex.split(resume)[3:] + ["--dry_run"]) == 0
    assert "(5 of them are Incomplete and will run with --resume.)" in capsys.readouterr().out
    assert sweep_cli.main(shlex.split(delete)[3:] + ["--skip_confirmation"]) == 0
    assert job_dirs(tmp_path) == names[:1]
    sweep_cli.main(argv)
    assert "Incomplete" not in capsys.readouterr().out.split("About to launch")[1]


def test_cli_dry_run_creates_nothing(tmp_path, capsys):
    assert sweep_cli.main(cli(tmp_path, "--dry_run", launcher=None)) == 0
    out = capsys.readouterr().out
    assert "About to launch 6 jobs." in out and "Dry run" in out
    assert out.count(" -m dg_plugins.scripts.train ") == 6
    assert not (tmp_path / "out").exists()
    sweep_cli.main(cli(tmp_path))
    assert sweep_cli.main(cli(tmp_path, "--dry_run", command="delete_all", launcher=None)) == 0
    assert len(job_dirs(tmp_path)) == 6


def no_estimate(monkeypatch):
    """The prompt without the cost estimate above it (its child process times training steps;
    tests/sweep/test_sweep_costs.py checks it, and test_cli_subprocess_prompt_no_torch runs it)."""
    from dg_plugins.sweep import costs as estimate

    monkeypatch.setenv(estimate.TIMEOUT_ENV, "0")


@pytest.mark.parametrize("answer, launched", [("n\n", False), ("Yes\n", True)])
def test_cli_confirmation_prompt(tmp_path, capsys, monkeypatch, answer, launched):
    no_estimate(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    argv = [a for a in cli(tmp_path) if a != "--skip_confirmation"]
    assert sweep_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Are you sure? (y/n) " in out
    assert ("Nevermind!" in out) is not launched
    assert len(job_dirs(tmp_path)) == (6 if launched else 0)


def test_cli_confirmation_without_answer_fails_clearly(tmp_path, capsys, monkeypatch):
    no_estimate(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    argv = [a for a in cli(tmp_path) if a != "--skip_confirmation"]
    assert sweep_cli.main(argv) == 2
    assert "--skip_confirmation" in capsys.readouterr().err
    assert job_dirs(tmp_path) == []


def test_cli_subprocess_prompt_no_torch(tmp_path):
    """Real stdin: 'n' gives Nevermind! and exit 0; enumeration (and the cost estimate before
    the prompt, in its child process; jobs this short are not timed) never imports torch."""
    code = ("import sys; from dg_plugins.scripts import sweep; rc = sweep.main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    argv = [a for a in cli(tmp_path, "--steps", "5") if a != "--skip_confirmation"]
    proc = subprocess.run([sys.executable, "-c", code, *argv], input="n\n", text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("Nevermind!")
    assert "Cost of the 6 jobs: 30 training steps" in proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, message", [
    (["--datasets", "NoSuchData"], "unknown dataset 'NoSuchData'.*choices: .*VLCS"),
    (["--algorithms", "NoSuchAlgo"], "unknown algorithm.*'NoSuchAlgo'.*ERM"),
    (["--command_launcher", "nope"], "unknown --command_launcher 'nope'; choices: .*dummy"),
    (["--n_hparams", "0"], "--n_hparams \\(0\\) must be greater than --n_hparams_from"),
    (["--single_source", "--single_test_envs"], "mutually exclusive"),
    (["--hparams", "[1]"], "--hparams must be a JSON object"),
    (["--task", "domain_adaptation"], "needs --uda_holdout_fraction"),
    (["--hparams", '{"lrr": 0.1}'], "--hparams for ERM on .*'lrr'.*lr"),
    (["--hparams", '{"batch_size": 0}'], "--hparams for ERM on .*batch_size"),
    (["--alignment_threshold", "0.3"], "need --alignment_scores FILE"),
    (["--alignment_scores", "no_such_scores.csv"], "is not a file"),
])
def test_cli_errors(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        sweep_cli.main(cli(tmp_path) + extra)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_an_error_shows_one_usage_line_not_every_flag(tmp_path, capsys):
    """As train: the usage line and the error, not argparse's 45 lines of flags above it."""
    for extra, error in ((["--algorithms", "ERMM"], "unknown algorithm 'ERMM' (did you mean "
                          "'ERM'"),
                         (["--n_trials", "two"], "argument --n_trials: invalid int value: "
                          "'two'")):
        with pytest.raises(SystemExit) as exit_info:
            sweep_cli.main(cli(tmp_path) + extra)
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2, lines
        assert lines[0] == f"usage: {sweep_cli.SHORT_USAGE}"
        assert lines[0].startswith(
            "usage: python -m dg_plugins.scripts.sweep {launch,delete_incomplete,delete_all,status,"
            "cancel} ")
        assert lines[1].startswith(f"python -m dg_plugins.scripts.sweep: error: {error}")


def test_multi_gpu_without_a_gpu_is_refused_before_any_job_folder(tmp_path, capsys,
                                                                   monkeypatch):
    """On a CPU machine ``--command_launcher multi_gpu`` gets the usage line and one error with
    the fix, and no job folder is made (it was a traceback after the folders were claimed); a
    dry run, which launches nothing, still lists the jobs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit) as exit_info:
        sweep_cli.main(cli(tmp_path, launcher="multi_gpu"))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[1].endswith("error: --command_launcher multi_gpu: no GPU visible "
                             "(CUDA_VISIBLE_DEVICES is empty or torch.cuda.device_count() is 0); "
                             "use the local launcher on CPU machines")
    assert job_dirs(tmp_path) == []
    assert sweep_cli.main(cli(tmp_path, "--dry_run", launcher="multi_gpu")) == 0
    assert "Dry run: nothing is launched." in capsys.readouterr().out


def test_cli_launch_needs_a_launcher(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sweep_cli.main(cli(tmp_path, launcher=None))
    assert "launch needs --command_launcher" in capsys.readouterr().err


def test_cli_pass_through_flags(tmp_path, capsys):
    sweep_cli.main(cli(tmp_path, "--single_source", "--checkpoint_freq", "2",
                       "--uda_holdout_fraction", "0.1", "--steps", "3"))
    commands = [l for l in capsys.readouterr().out.splitlines() if l.startswith("Dummy")]
    assert len(commands) == 3
    assert all("--checkpoint_freq 2 " in c and c.endswith(" --uda_holdout_fraction 0.1")
               and "--steps 3 " in c for c in commands)
    assert sorted(c.split("--test_envs ")[1].split(" --")[0] for c in commands) == [
        "0 1", "0 2", "1 2"]


def test_cli_alignment_flags_reach_every_job(tmp_path, capsys):
    scores = tmp_path / "scores.csv"
    scores.write_text("env,path,label,score\n")
    sweep_cli.main(cli(tmp_path, "--alignment_scores", str(scores), "--alignment_threshold",
                       "0.3"))
    commands = [l for l in capsys.readouterr().out.splitlines() if l.startswith("Dummy")]
    assert commands and all(f"--alignment_scores {scores} --alignment_threshold 0.3" in c
                            for c in commands)


# ---------------------------------------------------------------------------------------------
# End to end with the real train script


def test_end_to_end_local_launch_then_relaunch(tmp_path, capfd):
    """A real Debug28 job through the local launcher (two others pre-marked Done are skipped);
    a relaunch then finds every job Done. (test_launchers runs real jobs through submitit.)"""
    argv = cli(tmp_path, "--steps", "3", "--hparams", '{"batch_size": 8}', "--single_test_envs",
               launcher="local")
    names = [sweep_jobs.job_folder_name(a) for a in debug_args(
        single_test_envs=True, steps=3, hparams='{"batch_size": 8}',
        data_dir=str(tmp_path / "data"))]
    for name in names[1:]:
        (tmp_path / "out" / name).mkdir(parents=True)
        (tmp_path / "out" / name / "done").write_text("")
    assert sweep_cli.main(argv) == 0
    out = capfd.readouterr().out
    assert "About to launch 1 jobs." in out and "all 1 commands succeeded" in out
    job_dir = tmp_path / "out" / names[0]
    assert (job_dir / "done").exists()
    records = [json.loads(line) for line in (job_dir / "results.jsonl").open()]
    assert [r["step"] for r in records] == [0, 2]
    assert records[0]["args"]["output_dir"] == str(job_dir)
    assert records[0]["args"]["seed"] == sweep_jobs.seed_hash("Debug28", "ERM", [0], 0, 0)
    assert sweep_cli.main(argv) == 0
    assert "3 jobs: 3 done, 0 incomplete, 0 not launched." in capfd.readouterr().out


def test_plugin_algorithm_in_one_test_file_runs_through_a_sweep(tmp_path, capfd, monkeypatch):
    """A test-only algorithm (tests/plugins/toy_two_heads.py, one file) named in
    $DG_PLUGINS_IMPORT is accepted by the sweep and trained by its jobs (child processes)."""
    plugins_dir = Path(__file__).resolve().parents[1] / "plugins"
    monkeypatch.setenv("DG_PLUGINS_IMPORT", "toy_two_heads")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(plugins_dir), *filter(None, [os.environ.get("PYTHONPATH")])]))
    argv = cli(tmp_path, "--steps", "2", "--hparams", '{"batch_size": 4}', launcher="local")
    argv[argv.index("ERM")] = "ToyTwoHeads"
    argv += ["--single_test_envs"]
    names = [sweep_jobs.job_folder_name(a) for a in debug_args(
        algorithms=["ToyTwoHeads"], single_test_envs=True, steps=2, hparams='{"batch_size": 4}',
        data_dir=str(tmp_path / "data"))]
    for name in names[1:]:  # run one job only
        (tmp_path / "out" / name).mkdir(parents=True)
        (tmp_path / "out" / name / "done").write_text("")
    assert sweep_cli.main(argv) == 0
    assert "all 1 commands succeeded" in capfd.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "out" / names[0] / "results.jsonl").open()]
    assert records[-1]["args"]["algorithm"] == "ToyTwoHeads"


@pytest.mark.parametrize("flags", [
    ["--steps", "0"], ["--checkpoint_freq", "0"], ["--holdout_fraction", "1.5"],
    ["--uda_holdout_fraction", "-0.1"], ["--udg_ft_epochs", "3"],
    ["--alignment_threshold", "0.3"],
])
def test_train_and_sweep_refuse_a_bad_train_flag_with_the_same_message(tmp_path, capsys, flags):
    """The train flags' range checks are written once (``job.flags.check_ranges``): a value that
    train refuses, sweep refuses before launching anything, with the same words."""
    from dg_plugins.train import cli as train_cli
    from dg_plugins.job.flags import check_ranges

    with pytest.raises(ValueError) as refused:
        check_ranges(train_cli.build_parser().parse_args(flags))
    with pytest.raises(SystemExit) as exited:
        sweep_cli.main(["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir",
                        "x", "--output_dir", str(tmp_path / "s"), "--dry_run", *flags])
    assert exited.value.code == 2
    message = str(refused.value).replace("give --label_fraction ", "give --label_fractions ")
    assert f"error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_missing_plugin_module_and_a_mistyped_flag_are_one_line_each(tmp_path, capsys,
                                                                        monkeypatch):
    """$DG_PLUGINS_IMPORT naming a module that does not import, and a mistyped flag (with "did
    you mean"), are a usage line and one error line, no traceback (the sweep's ``main``: a
    traceback would be an exception here)."""
    base = ["launch", "--datasets", "Debug28", "--data_dir", str(tmp_path / "data"),
            "--output_dir", str(tmp_path / "out"), "--dry_run"]
    monkeypatch.setenv("DG_PLUGINS_IMPORT", "no_such_plugin_x")
    with pytest.raises(SystemExit) as exited:
        sweep_cli.main(base)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert exited.value.code == 2 and "Traceback" not in text, text
    assert "plugin module 'no_such_plugin_x'" in text and len(text.strip().splitlines()) == 2
    monkeypatch.delenv("DG_PLUGINS_IMPORT")
    with pytest.raises(SystemExit) as exited:
        sweep_cli.main(base + ["--algorithms", "ERM", "--n_trails", "1"])
    text = capsys.readouterr().err
    assert exited.value.code == 2 and "did you mean --n_trials?" in text, text
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# A queue of several sweeps (reproduce's one launch): each sweep folder's own command line


@pytest.mark.parametrize("outcome", ["failed", "stopped"])
def test_a_queue_of_sweeps_names_each_sweep_folders_own_command(tmp_path, capsys, outcome):
    """run_action with a command line per sweep folder (two sweeps of one queue): each folder's
    claim carries that sweep's launch line, and after failures (or a stop) each sweep with jobs
    left gets its own delete_incomplete (or launch --resume) line, never "<your flags>"."""
    import signal

    from dg_plugins.sweep import jobs as claims
    from dg_plugins.sweep.processes import JobsFailed, LaunchInterrupted, command_output_dir

    argvs, queue = {}, []
    for name in ("a", "b"):
        argv = [a for a in cli(tmp_path) if a != "--output_dir" and a != str(tmp_path / "out")]
        argv += ["--output_dir", str(tmp_path / name)]
        args = sweep_cli.build_parser().parse_args(argv)
        sweep_cli.validate(sweep_cli.build_parser(), args)
        queue += sweep_jobs.make_jobs(sweep_cli.make_args_list(args), args.output_dir)[:2]
        argvs[str(tmp_path / name)] = argv
    seen = {}

    def launcher(commands):
        for name in ("a", "b"):
            seen[name] = [c.command for c in claims.live_claims(str(tmp_path / name))]
        first = {os.path.basename(os.path.dirname(command_output_dir(c))): c
                 for c in reversed(commands)}
        if outcome == "stopped":
            raise LaunchInterrupted(signal.SIGTERM, [first["a"]], [first["b"]])
        raise JobsFailed([first["a"], first["b"]], len(commands), exit_codes=[1, 1])

    code = actions.run_action("launch", queue, launcher_fn=launcher, skip_confirmation=True,
                              command_line=argvs)
    out = capsys.readouterr().out
    assert code == (143 if outcome == "stopped" else 1)
    assert "<your flags>" not in out
    for name in ("a", "b"):
        (claim,) = seen[name]
        assert f" launch --datasets Debug28 " in claim and f"--output_dir {tmp_path / name} " \
            in claim + " "
    action = "launch" if outcome == "stopped" else "delete_incomplete"
    lines = [line.strip() for line in out.splitlines()
             if f" -m dg_plugins.scripts.sweep {action} " in line]
    assert [line.split("--output_dir ")[1].split()[0] for line in lines] == [
        str(tmp_path / "a"), str(tmp_path / "b")], out
    assert all(("--resume" in line) == (outcome == "stopped") for line in lines)
