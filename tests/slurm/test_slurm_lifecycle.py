"""Sweeps on a real one-node Slurm the suite starts (tests/slurm/conftest.py), under
``proctrack/linuxproc``: the records and tables equal the local launcher's; a job requeued by
``scontrol requeue``, one that outlives its time limit, and one cancelled then relaunched all
finish with the records of an uninterrupted run; a relaunch while jobs pend or run submits
nothing and names their Slurm ids; bad settings are refused before any job folder exists."""

from __future__ import annotations

import re

import pytest

import lifecycle as lc
from slurm_cluster import free_port

PROCTRACK = "linuxproc"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return lc.local_reference(tmp_path_factory)


def test_a_sweep_on_slurm_equals_the_local_launchers(cluster, reference, tmp_path):
    """The default launch on a CPU partition (no GPU flag): two array tasks, records and tables
    as the local launcher's; each folder records its Slurm job; status says done."""
    out = tmp_path / "sweep"
    code, text = lc.run_sweep(cluster, "launch", lc.sweep_args(out, ("0", "1"),
                                                               "--command_launcher", "submitit"))
    assert code == 0, text
    assert "partition debug has no GPUs; the jobs run on CPU" in text
    assert "submitted 2 jobs to slurm as array" in text
    cluster.wait_until(lambda: lc.all_done(out, 2), "both jobs done", lc.TIMEOUT)
    assert lc.records_by_job(out) == lc.records_by_job(reference)
    assert lc.tables(out) == lc.tables(reference)
    ids = {lc.slurm_id(folder) for folder in lc.job_folders(out)}
    assert len(ids) == 2 and all("_" in i for i in ids)
    code, text = lc.run_sweep(cluster, "status", lc.sweep_args(out))
    assert code == 0 and "2 jobs: 2 done" in text, text


def test_scontrol_requeue_of_a_running_job_continues_by_itself(cluster, reference, tmp_path):
    """Preemption: the running job stops at a checkpoint, Slurm requeues it and the rerun
    resumes it, with no human; the records equal an uninterrupted run's. The partition's
    2-minute MaxTime fits the default time limit (and signal delay) to it."""
    out, gate = tmp_path / "sweep", tmp_path / "gate"
    env = lc.gated_env(gate, step=2)
    code, text = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, ("0",), "--command_launcher", "submitit", "--slurm_partition", "short"), env=env)
    assert code == 0, text
    assert "default time limit (1440 min) is over partition short's MaxTime" in text
    (folder,) = lc.job_folders(out)
    job_id = lc.slurm_id(folder)
    cluster.wait_until(lambda: (gate / "waiting").exists(), "the job at its gate")
    cluster.client("scontrol", "requeue", job_id)
    cluster.wait_until(lambda: cluster.squeue().get(job_id, ("",))[0] == "PENDING",
                       "the requeued job pending")
    (gate / "release").touch()
    cluster.start_now()
    cluster.wait_until(lambda: lc.all_done(out, 1), "the requeued job done", lc.TIMEOUT)
    assert lc.records_by_job(out)[folder.name] == lc.records_by_job(reference)[folder.name]
    out_txt = (folder / "out.txt").read_text()
    assert "Resuming" in out_txt or "resum" in out_txt.lower(), out_txt[-2000:]


def test_a_time_limit_shorter_than_the_job_is_checkpointed_and_requeued(cluster, reference,
                                                                         tmp_path):
    """Two jobs sharing one task (--jobs_per_gpu 2), held past their 1-minute allocation:
    Slurm's signal (10 s before the limit) stops both at a checkpoint, the task requeues itself,
    and the next allocation finishes both, each with the records of an uninterrupted run."""
    out, gate = tmp_path / "sweep", tmp_path / "gate"
    env = lc.gated_env(gate, step=2)
    code, text = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, ("0", "1"), "--command_launcher", "submitit", "--jobs_per_gpu", "2",
        "--slurm_partition", "short", "--slurm_time", "1", "--slurm_signal_delay", "10"),
        env=env)
    assert code == 0 and "(1 tasks, 2 jobs per task" in text, text
    folders = lc.job_folders(out)
    (job_id,) = {lc.slurm_id(folder) for folder in folders}
    # (a job still starting when the signal came restarts from step 0: the same records)
    cluster.wait_until(lambda: cluster.squeue().get(job_id, ("",))[0] == "PENDING",
                       "the task requeued at its limit", timeout=150)
    log = lc.task_log(out, job_id)
    assert "time limit: the jobs stopped at a checkpoint; requeued" in log, log[-3000:]
    (gate / "release").touch()
    cluster.start_now()
    cluster.wait_until(lambda: lc.all_done(out, 2), "the jobs done after the requeue", lc.TIMEOUT)
    assert lc.records_by_job(out) == lc.records_by_job(reference)


def test_a_relaunch_while_jobs_pend_or_run_submits_nothing_then_cancel_and_resume(
        cluster, reference, tmp_path):
    """One job runs (held at its gate), one pends (array parallelism 1): a relaunch with
    --resume submits nothing and names both Slurm ids, delete_incomplete deletes nothing,
    status shows them; cancel stops them at a checkpoint, no train process outlives the
    allocation, and a relaunch finishes both with the records of an uninterrupted run."""
    out, gate = tmp_path / "sweep", tmp_path / "gate"
    env = lc.gated_env(gate, step=2)
    args = lc.sweep_args(out, ("0", "1"), "--command_launcher", "submitit",
                         "--slurm_array_parallelism", "1")
    code, text = lc.run_sweep(cluster, "launch", args, env=env)
    assert code == 0, text
    ids = sorted(lc.slurm_id(f) for f in lc.job_folders(out))
    cluster.wait_until(lambda: (gate / "waiting").exists(), "the first job at its gate")
    before = cluster.squeue()
    code, text = lc.run_sweep(cluster, "launch", [*args, "--resume"], env=env)
    assert code == 0, text
    assert "2 held by Slurm" in text and "About to launch 0 jobs." in text, text
    for job_id in ids:
        assert f"Slurm job {job_id}: " in text, text
    assert "JobArrayTaskLimit" in text, text
    assert set(cluster.squeue()) == set(before)
    code, text = lc.run_sweep(cluster, "delete_incomplete", lc.sweep_args(out), env=env)
    assert code == 0 and "About to delete 0 jobs." in text, text
    code, text = lc.run_sweep(cluster, "status", lc.sweep_args(out), env=env)
    assert "Slurm job" in text and "running" in text and "pending" in text, text
    code, text = lc.run_sweep(cluster, "cancel", lc.sweep_args(out), env=env)
    assert code == 0 and "Cancelled" in text, text
    cluster.wait_until(lambda: not cluster.squeue(), "the cancelled jobs gone")
    assert lc.no_train_process_left(env) == []
    code, text = lc.run_sweep(cluster, "status", lc.sweep_args(out), env=env)
    assert "interrupted" in text and "never started" in text, text
    (gate / "release").touch()
    code, text = lc.run_sweep(cluster, "launch", [*args, "--resume"], env=env)
    assert code == 0 and "submitted 2 jobs to slurm" in text, text
    cluster.wait_until(lambda: lc.all_done(out, 2), "both relaunched jobs done", lc.TIMEOUT)
    assert lc.records_by_job(out) == lc.records_by_job(reference)


@pytest.mark.parametrize("flags, message", [
    (["--slurm_partition", "nope"], "--slurm_partition nope: no such partition (partitions: "
     "debug, short)"),
    (["--slurm_partition", "short", "--slurm_time", "5"], "--slurm_time 5 is over partition "
     "short's MaxTime (2 min); pass --slurm_time 2 or less"),
    (["--slurm_gpus_per_node", "1"], "--slurm_gpus_per_node 1: partition debug's nodes have no "
     "GPUs; pass --slurm_gpus_per_node 0"),
    (["--slurm_mem_gb", "999"], "--slurm_mem_gb 999: partition debug's nodes have at most"),
    (["--slurm_cpus_per_task", "64"], "--slurm_cpus_per_task 64: partition debug's nodes have "
     "at most 2 CPUs"),
    (["--slurm_extra", '{"slurm_constraint": "nosuchfeature"}'], "Slurm refused the "
     "submission"),
])
def test_a_bad_setting_is_refused_with_one_line_and_no_folder(cluster, tmp_path, flags,
                                                              message):
    out = tmp_path / "sweep"
    code, text = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, ("0",), "--command_launcher", "submitit", *flags))
    assert code == 2, text
    assert message in text and "Traceback" not in text, text
    assert not out.exists() or lc.job_folders(out) == [], list(out.iterdir())


def test_a_controller_that_does_not_answer_is_refused_before_any_folder(cluster, tmp_path):
    conf = tmp_path / "slurm.conf"
    text = open(cluster.env["SLURM_CONF"]).read()
    port = re.search(r"SlurmctldPort=(\d+)", text).group(1)
    conf.write_text(text.replace(f"SlurmctldPort={port}", f"SlurmctldPort={free_port()}"))
    out = tmp_path / "sweep"
    env = dict(lc.processes.command_env(), SLURM_CONF=str(conf))
    code, text = lc.processes.run(lc.SWEEP, "launch", *lc.sweep_args(
        out, ("0",), "--command_launcher", "submitit"), "--skip_confirmation", env=env,
        timeout=120)
    assert code == 2 and "Slurm's controller does not answer" in text, text
    assert "Traceback" not in text and not out.exists()
