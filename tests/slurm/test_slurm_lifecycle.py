"""Sweeps on real one-node Slurms the suite starts (tests/slurm/conftest.py), under
``proctrack/linuxproc`` (Slurm signals every process of a job) and ``proctrack/cgroup`` (what
most clusters run: Slurm signals the task, which passes the signals on to train). On both: a job
requeued by ``scontrol requeue`` and a task that outlives its time limit finish with the records
of an uninterrupted run (two jobs in one task under cgroup). What does not depend on how Slurm
tracks a job's processes runs on one cluster: the default launch's records and tables equal the
local launcher's (linuxproc); a relaunch while jobs pend or run submits nothing and names their
Slurm ids, and jobs cancelled then relaunched finish (cgroup, where the task must pass scancel's
SIGTERM on); bad settings and a controller that does not answer are refused before any job
folder exists (linuxproc). Every scenario runs at once (lifecycle.Scenario); each test checks
one."""

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
    env = lc.gated_env(gate)
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


def timed_out(cluster, out, gate, test_env_sets):
    """One task (with two test-env sets, two jobs sharing it: --jobs_per_gpu 2) whose jobs wait
    at the gate in a 2-minute allocation: Slurm's signal (50 s before the limit, or up to 30 s
    earlier: its periodic check) stops them at a checkpoint, the task requeues itself, and the
    next allocation finishes them. The requeued job is given 10 minutes (as an operator may), so
    that its run never races a second signal."""
    env = lc.gated_env(gate)
    shared = ["--jobs_per_gpu", "2"] if len(test_env_sets) > 1 else []
    code, launched = lc.run_sweep(cluster, "launch", lc.sweep_args(
        out, test_env_sets, "--command_launcher", "submitit", *shared,
        "--slurm_partition", "short", "--slurm_time", "2", "--slurm_signal_delay", "50"),
        env=env)
    assert code == 0, launched
    (job_id,) = {lc.slurm_id(folder) for folder in lc.job_folders(out)}
    # (a job still starting when the signal came restarts from step 0: the same records)
    requeued = "time limit: the jobs stopped at a checkpoint; requeued"
    cluster.wait_until(lambda: requeued in lc.task_log(out, job_id),
                       "the task requeued at its limit", timeout=200)
    log = lc.task_log(out, job_id)
    (gate / "release").touch()
    # at once, whether the job still runs, pends, or already runs again (another scenario's
    # wait starts requeued jobs): a longer limit counts from the allocation's start
    cluster.wait_until(lambda: cluster.succeeds("scontrol", "update", f"JobId={job_id}",
                                                "TimeLimit=10"), "the job given 10 minutes")
    cluster.wait_until(lambda: lc.all_done(out, len(test_env_sets)),
                       "the jobs done after the requeue", lc.TIMEOUT, start_requeued=True)
    return launched, log


def relaunched_while_held(cluster, out, gate):
    """One job runs (held at its gate), one pends (array parallelism 1): relaunch, delete,
    status; then cancel, status, and a relaunch that finishes both (at once)."""
    env = lc.gated_env(gate)
    base = lc.sweep_args(out, ("0", "1"), "--command_launcher", "submitit")
    args = [*base, "--slurm_array_parallelism", "1"]
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
    code, texts["resume"] = lc.run_sweep(cluster, "launch", [*base, "--resume"], env=env)
    assert code == 0, texts["resume"]
    cluster.wait_until(lambda: lc.all_done(out, 2), "both relaunched jobs done", lc.TIMEOUT)
    return ids, before, after, left, texts


def no_controller(cluster, out):
    """A launch whose SLURM_CONF names a port no controller listens on (its clients give up
    after their retries, seconds that pass while the other scenarios run)."""
    conf = out.parent / "slurm.conf"
    text = open(cluster.env["SLURM_CONF"]).read()
    port = re.search(r"SlurmctldPort=(\d+)", text).group(1)
    conf.write_text(text.replace(f"SlurmctldPort={port}", f"SlurmctldPort={free_port()}"))
    env = dict(lc.processes.command_env(), SLURM_CONF=str(conf))
    return lc.processes.run(lc.SWEEP, "launch", *lc.sweep_args(
        out, ("0",), "--command_launcher", "submitit"), "--skip_confirmation", env=env,
        timeout=120)


#: Each cluster's scenarios: ``name: (function, gated, more arguments)``. The signal scenarios
#: (a requeue, a time limit) run on both; the others on one.
SCENARIOS = {
    "linuxproc": {"default": (default_launch, False, ()),
                  "requeue": (requeued_by_slurm, True, ()),
                  "time limit": (timed_out, True, (("0",),)),
                  "no controller": (no_controller, False, ())},
    "cgroup": {"requeue": (requeued_by_slurm, True, ()),
               "time limit": (timed_out, True, (("0", "1"),)),
               "held": (relaunched_while_held, True, ())},
}


@pytest.fixture(scope="module")
def runs(clusters, tmp_path_factory):
    """Every scenario on every cluster that started, at once, and the local reference."""
    started = {"reference": lc.Scenario(lc.local_reference, tmp_path_factory)}
    for proctrack, cluster in clusters.items():
        if not isinstance(cluster, Cluster):
            continue
        for name, (fn, gated, more) in SCENARIOS[proctrack].items():
            root = tmp_path_factory.mktemp(f"{proctrack}_{name.replace(' ', '_')}")
            folders = (root / "sweep", root / "gate") if gated else (root / "sweep",)
            started[proctrack, name] = lc.Scenario(fn, cluster, *folders, *more)
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


SIGNALS = pytest.mark.parametrize("proctrack", PROCTRACKS)


def test_a_sweep_on_slurm_equals_the_local_launchers(runs, clusters):
    """Records and tables as the local launcher's; the GPU default fitted to the CPU partition;
    each folder records its Slurm job; status says done."""
    launched, status = outcome(runs, clusters, "linuxproc", "default")
    assert "partition debug has no GPUs; the jobs run on CPU" in launched
    assert "submitted 2 jobs to slurm as array" in launched
    out = same_records(runs, "linuxproc", "default")
    assert lc.tables(out) == lc.tables(runs["reference"].outcome())
    ids = {lc.slurm_id(folder) for folder in lc.job_folders(out)}
    assert len(ids) == 2 and all("_" in i for i in ids)
    assert "2 jobs: 2 done" in status, status


@SIGNALS
def test_scontrol_requeue_of_a_running_job_continues_by_itself(runs, clusters, proctrack):
    launched = outcome(runs, clusters, proctrack, "requeue")
    assert "default time limit (1440 min) is over partition short's MaxTime" in launched
    out = same_records(runs, proctrack, "requeue")
    (folder,) = lc.job_folders(out)
    assert f"Resuming from step {lc.GATE_STEP + 1}" in (folder / "out.txt").read_text()


@SIGNALS
def test_a_time_limit_shorter_than_the_job_is_checkpointed_and_requeued(runs, clusters,
                                                                         proctrack):
    launched, log = outcome(runs, clusters, proctrack, "time limit")
    shared = "(1 tasks, 2 jobs per task" if proctrack == "cgroup" else "(1 tasks, partition"
    assert shared in launched, launched
    assert "time limit: the jobs stopped at a checkpoint; requeued" in log, log[-3000:]
    same_records(runs, proctrack, "time limit")


def test_a_relaunch_while_jobs_pend_or_run_submits_nothing_then_cancel_and_resume(
        runs, clusters):
    """The relaunch submits nothing and names both Slurm ids (one running, one pending),
    delete_incomplete deletes nothing, status shows them; cancel stops them, no train process
    outlives the allocation (under cgroup, where Slurm signals the task only), and a relaunch
    finishes both with an uninterrupted run's records."""
    ids, before, after, left, texts = outcome(runs, clusters, "cgroup", "held")
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
    same_records(runs, "cgroup", "held")


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
def test_a_bad_setting_is_refused_with_one_line_and_no_folder(cluster, tmp_path, monkeypatch,
                                                              capsys, flags, message):
    """The sweep's ``main`` in this process (the refusal is the subject; the real command's
    process runs in every scenario above)."""
    from dg_plugins.sweep import cli as sweep_cli

    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    out = tmp_path / "sweep"
    try:
        code = sweep_cli.main(["launch", *lc.sweep_args(
            out, ("0",), "--command_launcher", "submitit", *flags), "--skip_confirmation"])
    except SystemExit as stop:
        code = stop.code
    text = "".join(capsys.readouterr())
    assert code == 2, text
    assert message in text and "Traceback" not in text, text
    assert not out.exists() or lc.job_folders(out) == [], list(out.iterdir())


def test_a_controller_that_does_not_answer_is_refused_before_any_folder(runs, clusters):
    code, text = outcome(runs, clusters, "linuxproc", "no controller")
    out = runs["linuxproc", "no controller"].args[1]
    assert code == 2 and "Slurm's controller does not answer" in text, text
    assert "Traceback" not in text and not out.exists()
