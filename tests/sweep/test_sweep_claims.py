"""Two launchers on one sweep: a launch claims the folders it queues until each job ends; another
launch or delete sees them as Queued by that live launcher (pid, host, how many jobs), leaves them
alone and never suggests deleting them, and runs only the jobs nobody holds; a claim whose
launcher died (SIGKILL) is stale and blocks nothing. Run as the user runs it: two real ``sweep
launch --command_launcher local`` processes at once, the first one's job held by the test's gate
so that the overlap is certain."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

from dg_plugins.sweep import actions
from dg_plugins.sweep import jobs as claims
from dg_plugins.sweep import jobs as sweep_jobs
from support.job_gate import gate_env, released
from support.processes import command_env, finish, start, survivors

SWEEP = "dg_plugins.scripts.sweep"


def debug_args(test_envs=((0,), (1,))):
    return sweep_jobs.make_args_list(
        n_trials=1, dataset_names=["Debug28"], algorithms=["ERM"], n_hparams_from=0,
        n_hparams=1, steps=3, data_dir="builtin", task="domain_generalization",
        holdout_fraction=0.2, single_test_envs=False, hparams=None, test_env_sets=test_envs,
        n_envs=lambda dataset: 3)


def argv(out, *test_envs, command="launch", launcher="local"):
    words = [command, "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", "builtin",
             "--output_dir", str(out), "--n_hparams", "1", "--n_trials", "1", "--steps", "3",
             "--checkpoint_freq", "3", "--hparams", '{"batch_size": 8}', "--skip_confirmation",
             "--test_env_sets", *(test_envs or ("0", "1"))]
    return words + (["--command_launcher", launcher] if launcher else [])


def wait_for(predicate, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# The mechanism, in one process (a claim's flock conflicts with any other open of its file)


def test_a_claim_makes_its_folders_queued_until_released(tmp_path, capsys):
    out = str(tmp_path / "out")
    first = sweep_jobs.make_jobs(debug_args(), out)
    with claims.LauncherClaim(out, "sweep launch ...") as claim:
        kept, others = claim.take(first, lambda job, held: job.refresh_state(held),
                                  lambda job: job.state == sweep_jobs.NOT_LAUNCHED,
                                  lambda job: os.makedirs(job.output_dir))
        assert kept == first and others == []
        second = sweep_jobs.make_jobs(debug_args(((0,), (1,), (2,))), out)
        assert [job.state for job in second] == ["Queued", "Queued", "Not launched"]
        assert second[0].launcher.pid == os.getpid()
        assert sweep_jobs.summary_line(second) == (
            "3 jobs: 0 done, 0 incomplete, 2 queued by another launcher, 1 not launched.")
        assert sweep_jobs.select_jobs(second, "launch", resume=True) == [second[2]]
        assert sweep_jobs.select_jobs(second, "delete_all") == []
        note = sweep_jobs.launcher_note(second, "launch")
        assert note[0] == (
            f"Note: another sweep launcher is working on this sweep: launcher pid {os.getpid()} "
            f"on {socket.gethostname()} (started {claim.started}) holds 2 of its jobs; 2 of them "
            "are queued (folder created, not started yet): not launched here.")

        # delete() itself re-reads the claims under the sweep lock: a folder selected while
        # Incomplete but claimed since is not deleted
        stale_view = sweep_jobs.make_jobs(debug_args(), out)
        for job in stale_view:
            job.state = sweep_jobs.INCOMPLETE
        actions.delete(stale_view)
        printed = capsys.readouterr().out
        assert printed.count("not deleted, queued by a live launcher pid") == 2
        assert "Deleted 0 jobs!" in printed
        assert all(os.path.isdir(job.output_dir) for job in first)

        claims.job_ended(first[0].output_dir)  # its job ended: seen as it is, Incomplete
        assert [job.state for job in sweep_jobs.make_jobs(debug_args(), out)] == [
            "Incomplete", "Queued"]
    assert [job.state for job in sweep_jobs.make_jobs(debug_args(), out)] == [
        "Incomplete", "Incomplete"]
    assert sorted(os.listdir(out)) == sorted(os.path.basename(j.output_dir) for j in first)


HOLD_CLAIM = textwrap.dedent("""
    import os, sys, time
    from dg_plugins.sweep import jobs
    from dg_plugins.sweep import jobs as claims
    out = sys.argv[1]
    args = jobs.make_args_list(1, ["Debug28"], ["ERM"], 0, 1, 3, "builtin",
                               "domain_generalization", 0.2, False, None,
                               test_env_sets=[[0], [1]], n_envs=lambda d: 3)
    with claims.LauncherClaim(out) as claim:
        claim.take(jobs.make_jobs(args, out), lambda j, held: j.refresh_state(held),
                   lambda j: True, lambda j: os.makedirs(j.output_dir, exist_ok=True))
        print("claimed", flush=True)
        time.sleep(300)
""")


def test_a_killed_launchers_claim_blocks_nothing(tmp_path):
    """A launcher killed by SIGKILL leaves its claim file, but the kernel dropped its lock: its
    folders are Incomplete (interrupted), and the next delete removes them and the stale claim."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(out)], env=command_env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "claimed\n"
        assert [j.state for j in sweep_jobs.make_jobs(debug_args(), str(out))] == ["Queued"] * 2
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert len(list((out / claims.CLAIMS_DIR).glob("*.claim"))) == 1  # left behind
    jobs = sweep_jobs.make_jobs(debug_args(), str(out))
    assert [j.state for j in jobs] == ["Incomplete"] * 2
    actions.delete(jobs)
    assert os.listdir(out) == []  # the folders, the stale claim and the sweep lock


# ---------------------------------------------------------------------------------------------
# Two real launchers at once


def test_a_second_launcher_leaves_the_first_ones_jobs_alone_and_runs_the_others(tmp_path,
                                                                               capfd):
    """Launcher A (a real ``sweep launch`` process) queues two jobs and is held in the first (the
    gate). An identical launch B says that A (pid, host) holds 2 jobs, launches nothing and
    suggests no delete; delete_incomplete deletes nothing; a launch C of three jobs runs only the
    one nobody holds, while A is still held (B, the delete and C: the sweep's ``main`` in this
    process, another process than A). Released, A runs its two jobs to the end, and nothing is
    left behind."""
    from dg_plugins.sweep import cli as sweep_cli

    out, gate = tmp_path / "out", tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=0)
    a = start(SWEEP, *argv(out), env=env)
    with released(gate):
        held_job = int(wait_for(lambda: (gate / "waiting").exists()
                                and (gate / "waiting").read_text()))
        host = socket.gethostname()

        assert sweep_cli.main(argv(out)) == 0
        text = capfd.readouterr().out
        assert "2 jobs: 0 done, 0 incomplete, 1 running, 1 queued by another launcher, " \
               "0 not launched." in text, text
        assert (f"Note: another sweep launcher is working on this sweep: launcher pid {a.pid} on "
                f"{host} (started ") in text
        assert "holds 2 of its jobs; 1 of them are queued (folder created, not started yet): " \
               "not launched here." in text
        assert f"running (pid {held_job})" in text
        assert "About to launch 0 jobs." in text
        assert "delete_incomplete" not in text and "interrupted or failed" not in text
        assert "Launch" not in text.split("About to launch 0 jobs.")[1]

        assert sweep_cli.main(argv(out, command="delete_incomplete", launcher=None)) == 0
        text = capfd.readouterr().out
        assert "About to delete 0 jobs." in text, text
        assert "queued (folder created, not started yet): not deleted." in text

        assert sweep_cli.main(argv(out, "0", "1", "2")) == 0
        text = capfd.readouterr().out
        assert "3 jobs: 0 done, 0 incomplete, 1 running, 1 queued by another launcher, " \
               "1 not launched." in text, text
        assert "[1/1] started: ERM on Debug28, test envs 2" in text
        assert "[1/1] done in " in text and "Launched 1 jobs!" in text
        assert not (gate / "release").exists() and alive(held_job)  # A was held all along
    code, text = finish(a, timeout=300)
    assert code == 0, text
    assert "[1/2] done in " in text and "[2/2] done in " in text, text
    assert sorted(p.name for p in out.iterdir() if (p / "done").exists()) == sorted(
        p.name for p in out.iterdir())
    assert len(list(out.iterdir())) == 3  # the claims are gone with their launchers
    assert survivors(env) == []


def test_a_killed_launchers_jobs_are_incomplete_for_the_next_launch(tmp_path, capsys):
    """SIGKILL of launcher A while its first job is held: the job follows it, and its claim no
    longer holds anything: the next launch (a dry run, its ``main`` in process) calls both jobs
    Incomplete, this time rightly offering to resume or delete them."""
    from dg_plugins.sweep import cli as sweep_cli

    out, gate = tmp_path / "out", tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=0)
    a = start(SWEEP, *argv(out), env=env)
    with released(gate):
        held_job = int(wait_for(lambda: (gate / "waiting").exists()
                                and (gate / "waiting").read_text()))
        os.kill(a.pid, signal.SIGKILL)
        wait_for(lambda: not alive(held_job), timeout=120)
        finish(a, timeout=30)
        capsys.readouterr()
        assert sweep_cli.main([*argv(out), "--dry_run"]) == 0
    text = capsys.readouterr().out
    assert "2 jobs: 0 done, 2 incomplete, 0 not launched." in text, text
    assert "another sweep launcher" not in text and "delete_incomplete" in text
