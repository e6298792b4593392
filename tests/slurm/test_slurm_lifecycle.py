"""Sweeps on real one-node Slurms the suite starts (tests/slurm/conftest.py), under
``proctrack/linuxproc`` (Slurm signals every process of a job) and ``proctrack/cgroup`` (what
most clusters run: Slurm signals the task, which passes the signals on to train): the records
and tables equal the local launcher's; a job requeued by ``scontrol requeue``, two that outlive
their time limit in one task, and jobs cancelled then relaunched all finish with the records of
an uninterrupted run; a relaunch while jobs pend or run submits nothing and names their Slurm
ids; bad settings are refused before any job folder exists. Every scenario on both clusters
runs at once (lifecycle.Scenario); each test checks one."""

from __future__ import annotations

import re

import pytest

import lifecycle as lc
from slurm_cluster import PROCTRACKS, Cluster, free_port, running


def default_launch(cluster, out):
    """The default launch on a CPU partition (no GPU flag): two array tasks."""
    code, launched = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, ("0", "1"), "--command_launcher", "submitit"))
    assert code == 0, launched
    cluster.wait_until(lambda: lc.all_done(out, 2), "both jobs done", lc.TIMEOUT)
    code, status = lc.run_sweep(cluster, "status", lc.sweep_args(out))
    assert code == 0, status
    return launched, status


def requeued_by_slurm(cluster, out, gate):
    """Preemption: the job held at its gate is requeued by ``scontrol requeue``; released, it
    finishes with no human. The partition's 2-minute MaxTime fits the default time limit."""
    env = lc.gated_env(gate, step=2)
    code, launched = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, ("0",), "--command_launcher", "submitit", "--slurm_partition", "short"), env=env)
    assert code == 0, launched
    (folder,) = lc.job_folders(out)
    job_id = lc.slurm_id(folder)
    cluster.wait_until(lambda: (gate / "waiting").exists(), "the job at its gate")
    cluster.client("scontrol", "requeue", job_id)
    err = folder / "err.txt"  # train says when the stop reached it (it leaves the gate then)
    cluster.wait_until(lambda: "received SIGTERM" in lc.text(err), "train stopped by Slurm")
    (gate / "release").touch()
    cluster.wait_until(lambda: lc.all_done(out, 1), "the requeued job done", lc.TIMEOUT,
                       start_requeued=True)
    return launched


def timed_out(cluster, out, gate):
    """Two jobs sharing one task (--jobs_per_gpu 2), held past their 2-minute allocation:
    Slurm's signal (10 s before the limit; Slurm sends it up to a minute early) stops both, the
    task requeues itself, and the next allocation finishes both."""
    env = lc.gated_env(gate, step=2)
    code, launched = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, ("0", "1"), "--command_launcher", "submitit", "--jobs_per_gpu", "2",
        "--slurm_partition", "short", "--slurm_time", "2", "--slurm_signal_delay", "10"),
        env=env)
    assert code == 0, launched
    (job_id,) = {lc.slurm_id(folder) for folder in lc.job_folders(out)}
    # (a job still starting when the signal came restarts from step 0: the same records)
    requeued = "time limit: the jobs stopped at a checkpoint; requeued"
    cluster.wait_until(lambda: requeued in lc.task_log(out, job_id),
                       "the task requeued at its limit", timeout=200)
    log = lc.task_log(out, job_id)
    (gate / "release").touch()
    cluster.wait_until(lambda: lc.all_done(out, 2), "the jobs done after the requeue", lc.TIMEOUT,
                       start_requeued=True)
    return launched, log


def relaunched_while_held(cluster, out, gate):
    """One job runs (held at its gate), one pends (array parallelism 1): relaunch, delete,
    status; then cancel, status, and a relaunch that finishes both."""
    env = lc.gated_env(gate, step=2)
    args = lc.sweep_args(out, ("0", "1"), "--command_launcher", "submitit",
                         "--slurm_array_parallelism", "1")
    texts = {}
    code, texts["launch"] = lc.run_sweep(cluster, "launch", args, env=env)
    assert code == 0, texts["launch"]
    ids = sorted(lc.slurm_id(f) for f in lc.job_folders(out))
    cluster.wait_until(lambda: (gate / "waiting").exists(), "the first job at its gate")
    before = {i: s for i, s in cluster.squeue().items() if i in ids}
    for action, extra in (("relaunch", ["--resume"]), ("delete_incomplete", []),
                          ("status", [])):
        verb = "launch" if action == "relaunch" else action
        code, texts[action] = lc.run_sweep(cluster, verb, [*args, *extra], env=env)
        assert code == 0, texts[action]
    after = {i: s for i, s in cluster.squeue().items() if i in ids}
    code, texts["cancel"] = lc.run_sweep(cluster, "cancel", args, env=env)
    assert code == 0, texts["cancel"]
    cluster.wait_until(lambda: lc.ids_gone(cluster, ids), "the cancelled jobs gone")
    left = lc.no_train_process_left(env)
    code, texts["status after cancel"] = lc.run_sweep(cluster, "status", args, env=env)
    (gate / "release").touch()
    code, texts["resume"] = lc.run_sweep(cluster, "launch", [*args, "--resume"], env=env)
    assert code == 0, texts["resume"]
    cluster.wait_until(lambda: lc.all_done(out, 2), "both relaunched jobs done", lc.TIMEOUT)
    return ids, before, after, left, texts


SCENARIOS = {"default": (default_launch, False), "requeue": (requeued_by_slurm, True),
             "time limit": (timed_out, True), "held": (relaunched_while_held, True)}


@pytest.fixture(scope="module")
def runs(clusters, tmp_path_factory):
    """Every scenario on every cluster that started, at once, and the local reference."""
    started = {"reference": lc.Scenario(lc.local_reference, tmp_path_factory)}
    for proctrack, cluster in clusters.items():
        if not isinstance(cluster, Cluster):
            continue
        for name, (fn, gated) in SCENARIOS.items():
            root = tmp_path_factory.mktemp(f"{proctrack}_{name.replace(' ', '_')}")
            folders = (root / "sweep", root / "gate") if gated else (root / "sweep",)
            started[proctrack, name] = lc.Scenario(fn, cluster, *folders)
    return started


def outcome(runs, clusters, proctrack, name):
    running(clusters, proctrack)
    return runs[proctrack, name].outcome()


def same_records(runs, proctrack, name):
    out = runs[proctrack, name].args[1]
    assert lc.records_by_job(out) == {
        job: records for job, records in lc.records_by_job(runs["reference"].outcome()).items()
        if (out / job).exists()}
    return out


LIFECYCLE = pytest.mark.parametrize("proctrack", PROCTRACKS)


@LIFECYCLE
def test_a_sweep_on_slurm_equals_the_local_launchers(runs, clusters, proctrack):
    """Records and tables as the local launcher's; the GPU default fitted to the CPU partition;
    each folder records its Slurm job; status says done."""
    launched, status = outcome(runs, clusters, proctrack, "default")
    assert "partition debug has no GPUs; the jobs run on CPU" in launched
    assert "submitted 2 jobs to slurm as array" in launched
    out = same_records(runs, proctrack, "default")
    assert lc.tables(out) == lc.tables(runs["reference"].outcome())
    ids = {lc.slurm_id(folder) for folder in lc.job_folders(out)}
    assert len(ids) == 2 and all("_" in i for i in ids)
    assert "2 jobs: 2 done" in status, status


@LIFECYCLE
def test_scontrol_requeue_of_a_running_job_continues_by_itself(runs, clusters, proctrack):
    launched = outcome(runs, clusters, proctrack, "requeue")
    assert "default time limit (1440 min) is over partition short's MaxTime" in launched
    out = same_records(runs, proctrack, "requeue")
    (folder,) = lc.job_folders(out)
    assert "Resuming from step 3" in (folder / "out.txt").read_text()


@LIFECYCLE
def test_a_time_limit_shorter_than_the_job_is_checkpointed_and_requeued(runs, clusters,
                                                                         proctrack):
    launched, log = outcome(runs, clusters, proctrack, "time limit")
    assert "(1 tasks, 2 jobs per task" in launched, launched
    assert "time limit: the jobs stopped at a checkpoint; requeued" in log, log[-3000:]
    same_records(runs, proctrack, "time limit")


@LIFECYCLE
def test_a_relaunch_while_jobs_pend_or_run_submits_nothing_then_cancel_and_resume(
        runs, clusters, proctrack):
    """The relaunch submits nothing and names both Slurm ids (one running, one pending),
    delete_incomplete deletes nothing, status shows them; cancel stops them, no train process
    outlives the allocation, and a relaunch finishes both with an uninterrupted run's records."""
    ids, before, after, left, texts = outcome(runs, clusters, proctrack, "held")
    relaunch = texts["relaunch"]
    assert "2 held by Slurm" in relaunch and "About to launch 0 jobs." in relaunch, relaunch
    assert all(f"Slurm job {job_id}: " in relaunch for job_id in ids), relaunch
    assert "JobArrayTaskLimit" in relaunch, relaunch
    assert set(after) == set(before) == set(ids)
    assert "About to delete 0 jobs." in texts["delete_incomplete"], texts["delete_incomplete"]
    status = texts["status"]
    assert "Slurm job" in status and "running" in status and "pending" in status, status
    assert "Cancelled" in texts["cancel"], texts["cancel"]
    assert left == []
    after_cancel = texts["status after cancel"]
    assert "interrupted" in after_cancel and "never started" in after_cancel, after_cancel
    assert "submitted 2 jobs to slurm" in texts["resume"], texts["resume"]
    same_records(runs, proctrack, "held")


def test_the_cgroup_cluster_tracks_its_jobs_with_cgroups(clusters):
    assert "freezer:/slurm" in running(clusters, "cgroup").client(
        "srun", "cat", "/proc/self/cgroup")


@pytest.mark.parametrize("flags, message", [
    (["--slurm_partition", "nope"], "--slurm_partition nope: no such partition (partitions: "
     "debug, short)"),
    (["--slurm_partition", "short", "--slurm_time", "5"], "--slurm_time 5 is over partition "
     "short's MaxTime (2 min); pass --slurm_time 2 or less"),
    (["--slurm_gpus_per_node", "1"], "--slurm_gpus_per_node 1: partition debug's nodes have no "
     "GPUs; pass --slurm_gpus_per_node 0"),
    (["--slurm_mem_gb", "999"], "--slurm_mem_gb 999: partition debug's nodes have at most"),
    (["--slurm_cpus_per_task", "64"], "--slurm_cpus_per_task 64: partition debug's nodes have "
     "at most 8 CPUs"),
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
