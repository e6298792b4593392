"""The lifecycle scenarios of test_slurm_lifecycle.py again under ``proctrack/cgroup`` (what
most clusters run: Slurm signals only the task, which passes the signals on to train); skipped
where cgroup v1's freezer is absent."""

from test_slurm_lifecycle import (  # noqa: F401  (collected here, on a cgroup cluster)
    runs, test_a_relaunch_while_jobs_pend_or_run_submits_nothing_then_cancel_and_resume,
    test_a_sweep_on_slurm_equals_the_local_launchers,
    test_a_time_limit_shorter_than_the_job_is_checkpointed_and_requeued,
    test_scontrol_requeue_of_a_running_job_continues_by_itself)

PROCTRACK = "cgroup"


def test_the_cluster_tracks_its_jobs_with_cgroups(cluster):
    assert "freezer:/slurm" in cluster.client("srun", "cat", "/proc/self/cgroup")
