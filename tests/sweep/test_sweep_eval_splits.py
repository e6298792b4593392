"""The sweep's evaluation flags: ``--eval_splits`` goes in every job's command when it is not
``all`` but never in a job's identity (its folder keeps DomainBed's name), ``--eval_batch_size``
enters the identity when it is not 64; a relaunch that would resume Incomplete jobs with the
other ``--eval_splits`` is refused before anything starts, naming the jobs and the fix; GMoE's
release protocol pins its evaluation batch; the scripts of sweeps/ pass ``selection`` unless
``EVAL_SPLITS=all``."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from dg_plugins.reference import paper_settings as ps
from dg_plugins import reproduce
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.train import cli as train_cli
from dg_plugins.train import run as train_run

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"


def argv(tmp_path, *extra, launcher="dummy"):
    return ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
            "--n_trials", "1", "--single_test_envs", "--steps", "6", "--checkpoint_freq", "2",
            "--hparams", '{"batch_size": 8}', "--data_dir", "builtin",
            "--output_dir", str(tmp_path / "out"), "--skip_confirmation",
            "--command_launcher", launcher, *extra]


def commands(out: str) -> list[str]:
    return [line[len("Dummy launcher: "):] for line in out.splitlines()
            if line.startswith("Dummy launcher: ")]


def test_eval_splits_is_in_the_commands_not_the_identity(tmp_path, capsys):
    assert sweep_cli.main(argv(tmp_path, "--dry_run")) == 0
    default = capsys.readouterr().out
    assert sweep_cli.main(argv(tmp_path, "--dry_run", "--eval_splits", "selection")) == 0
    chosen = capsys.readouterr().out
    assert "--eval_splits" not in default and chosen.count(" --eval_splits selection ") == 3
    assert default.replace("--eval_splits selection ", "") == chosen.replace(
        "--eval_splits selection ", "")  # the same folders (job identity) and otherwise commands
    assert sweep_cli.main(argv(tmp_path, "--dry_run", "--eval_splits", "all")) == 0
    assert capsys.readouterr().out == default


def test_eval_batch_size_enters_the_identity_when_not_64(tmp_path, capsys):
    listings = {}
    for size in ("64", "32"):
        assert sweep_cli.main(argv(tmp_path, "--dry_run", "--eval_batch_size", size)) == 0
        listings[size] = capsys.readouterr().out
    assert sweep_cli.main(argv(tmp_path, "--dry_run")) == 0
    assert listings["64"] == capsys.readouterr().out
    folders = {size: {w for w in text.split() if "/out/" in w} for size, text in listings.items()}
    assert folders["32"].isdisjoint(folders["64"])
    assert listings["32"].count("--eval_batch_size 32 ") == 3


def test_a_relaunch_with_the_other_value_refuses_incomplete_jobs_first(tmp_path, capsys):
    """Three jobs run with ``all``: one finished, one interrupted after a checkpoint, one never
    started (an empty folder). Relaunching with ``--resume --eval_splits selection`` is refused
    before anything starts, in one line naming the interrupted job and the fix; with the value
    it started with, the launch goes on (the interrupted job resumes, the finished one is
    skipped)."""
    assert sweep_cli.main(argv(tmp_path)) == 0  # dummy: creates the three folders
    first = commands(capsys.readouterr().out)
    done, stopped = (train_cli.build_parser().parse_args(shlex.split(c)[3:]) for c in first[:2])
    assert train_run.run(done) == "done"
    assert train_run.run(stopped, stop_after_step=2) == "stopped"
    capsys.readouterr()

    assert sweep_cli.main(argv(tmp_path, "--resume", "--eval_splits", "selection")) == 2
    out, err = capsys.readouterr()
    assert "Dummy launcher" not in out and "Launch" not in out
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: 1 Incomplete job(s) started with --eval_splits all, and this launch would "
        f"resume them with --eval_splits selection, which train refuses (a job's records never "
        f"mix the two): {stopped.output_dir}. Relaunch with --eval_splits all (sweeps/*.sh: "
        "EVAL_SPLITS=all) to finish them, or remove them with the sweep's delete_incomplete so "
        "that they start over"]

    assert sweep_cli.main(argv(tmp_path, "--resume")) == 0
    relaunched = commands(capsys.readouterr().out)
    assert len(relaunched) == 2 and all("--eval_splits" not in c for c in relaunched)
    assert any(c.endswith(" --resume") and stopped.output_dir in c for c in relaunched)
    assert not any(done.output_dir in c for c in relaunched)


def test_gmoes_release_protocol_pins_its_evaluation_batch(tmp_path, capsys):
    """GMoE evaluated at capacity 1.5 predicts differently in other batches: its release
    protocol's jobs run in the release's batches of 64 (every sweep call says so), its settings
    say why, and reproduce refuses another ``--eval_batch_size`` for it (DomainBed's protocol,
    batch-independent, leaves it free)."""
    setting = ps.get_setting("gmoe_domainbed")
    for name, pinned in (("release", True), ("domainbed", False)):
        protocol = setting.protocols[name]
        plan = reproduce.plan_setting(setting, protocol, data_dir=str(tmp_path),
                                      output_dir=str(tmp_path / "o"))
        flags = [" ".join(call.argv[i:i + 2]) for call in plan.calls
                 for i in range(len(call.argv) - 1)]
        assert flags.count("--eval_batch_size 64") == (len(plan.calls) if pinned else 0)
        assert flags.count("--eval_splits selection") == len(plan.calls)
    assert "capacity 1.5" in ps.describe(setting, setting.protocols["release"]).split(
        "--eval_batch_size = 64")[1].splitlines()[0]
    base = ["gmoe_domainbed", "--data_dir", str(tmp_path), "--dry_run", "--eval_batch_size",
            "128"]
    assert reproduce.main(base) == 2
    assert "--eval_batch_size: set by the setting's table" in capsys.readouterr().err
    assert reproduce.main(base + ["--protocol", "domainbed", "--datasets", "PACS",
                                  "--algorithms", "ERM_ViT"]) == 0
    assert "--eval_batch_size 128 " in capsys.readouterr().out


def script(tmp_path, name, **knobs):
    """``DRY_RUN=1 bash sweeps/<name>`` with ``knobs`` (caches under tmp_path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("EVAL_SPLITS", "DATASETS",
                                                            "ALGORITHMS", "PROTOCOL")}
    env.update(PYTHON=sys.executable, DRY_RUN="1", OUTPUT_DIR=str(tmp_path / "out"),
               DATA_DIR=str(tmp_path), HOME=str(tmp_path / "home"),
               TORCH_HOME=str(tmp_path / "torch"), HF_HOME=str(tmp_path / "hf"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), **knobs)
    return subprocess.run(["bash", str(SWEEPS / name)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_the_eval_splits_knob_of_the_scripts(tmp_path):
    """The scripts pass ``--eval_splits selection`` to every job (a plain sweep script and a
    paper setting through reproduce); ``EVAL_SPLITS=all`` restores every split (DomainBed's
    commands); another value is refused in one line."""
    for name, knobs in (("dmg_rotatedmnist5k.sh", {}),
                        ("gmoe_domainbed.sh", {"DATASETS": "PACS", "ALGORITHMS": "GMoE"})):
        for value in ("selection", "all"):
            proc = script(tmp_path, name, **knobs,
                          **({"EVAL_SPLITS": value} if value == "all" else {}))
            assert proc.returncode == 0, proc.stderr[-2000:]
            jobs = [line for line in proc.stdout.splitlines()
                    if " -m dg_plugins.scripts.train " in line]
            assert jobs and all(("--eval_splits selection" in job) == (value == "selection")
                                for job in jobs), name
    proc = script(tmp_path, "dmg_rotatedmnist5k.sh", EVAL_SPLITS="some")
    assert proc.returncode == 2 and proc.stderr.startswith("error: EVAL_SPLITS must be "
                                                           "selection")


def test_the_launchers_done_line_reads_a_selection_record():
    """A job's done line (the launcher's) gives the test environments' in-split accuracy and the
    sources' out-split accuracy from a record of either --eval_splits value: a selection record
    has no training-environment in-split, and its source validation is still printed."""
    from dg_plugins.sweep.progress import accuracy_summary
    from dg_plugins.job.selection import evaluated_splits

    accuracy = {"env0_in": 0.9, "env0_out": 0.8, "env1_in": 0.7, "env1_out": 0.6,
                "env2_in": 0.5, "env2_out": 0.4}
    for value in ("all", "selection"):
        record = {"step": 100, **{f"{split}_acc": accuracy[split]
                                  for split in evaluated_splits(value, [2], 3)}}
        assert ("env0_in_acc" in record) == (value == "all")
        assert accuracy_summary(record, [2]) == \
            "test-env accuracy 50.0%, source validation 70.0% (step 100)"


def test_a_launch_for_every_split_says_which_done_jobs_evaluated_only_the_selection(
        tmp_path, capsys):
    """A job finished with --eval_splits selection; a launch with --eval_splits all --resume
    skips it like any Done job, and says so: its records hold only the selection splits, and how
    to get every split's curves. A launch with selection, or over jobs that ran with all, says
    nothing of it."""
    assert sweep_cli.main(argv(tmp_path, "--eval_splits", "selection")) == 0
    first = commands(capsys.readouterr().out)
    job = train_cli.build_parser().parse_args(shlex.split(first[0])[3:])
    assert train_run.run(job) == "done"
    capsys.readouterr()

    assert sweep_cli.main(argv(tmp_path, "--eval_splits", "all", "--resume")) == 0
    out = capsys.readouterr().out
    assert ("Note: 1 Done job(s) evaluated only the selection splits (their records say "
            "args.eval_splits selection: no training-environment in-split at any step). Done "
            "jobs are never rerun, so this launch's --eval_splits all does not give them every "
            "split's learning curves. For those: launch into another --output_dir, or delete "
            "these job folders (delete_all with the same flags removes every job of this sweep) "
            "and launch again:") in out
    assert f"\n  {job.output_dir} ('Debug28', 'ERM', [" in out
    assert len(commands(out)) == 2  # the other two, resumed

    for extra in (["--eval_splits", "selection"], []):
        assert sweep_cli.main(argv(tmp_path, "--dry_run", *extra)) == 0
        assert ("Done job(s) evaluated only" in capsys.readouterr().out) == (extra == [])
