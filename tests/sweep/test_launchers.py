"""Launchers (``domainbed/command_launchers.py``): dummy, local, multi_gpu (fake GPU ids), submitit (local/debug executors
running real commands, so the code path Slurm uses is the one exercised)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dg_plugins.registry import LAUNCHERS
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep import jobs, launchers, processes, submitit
from dg_plugins.sweep import processes as fork
from support.processes import as_from_a_terminal

PY = shlex.quote(sys.executable)


@pytest.fixture(autouse=True)
def _fresh_submitit_options(monkeypatch):
    for var in submitit.SUBMITIT_ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)


def write_cmd(path: Path, text: str = "'ok'", exit_code: int = 0) -> str:
    """A shell command that writes ``text`` (a Python expression) to ``path``, then exits."""
    code = f"import os, sys; open({str(path)!r}, 'w').write(str({text})); sys.exit({exit_code})"
    return f"{PY} -c {shlex.quote(code)}"


def test_registered_launchers():
    assert {"dummy", "local", "multi_gpu", "submitit"} <= set(LAUNCHERS.list())
    assert LAUNCHERS.get("local") is launchers.local_launcher


PLUGIN_LAUNCHER = '''
import json, os
from dg_plugins.registry import LAUNCHERS

def recording_launcher(commands, grace_period_s=None):
    with open(os.environ["RECORD_TO"], "w") as f:
        json.dump({"commands": commands, "grace_period_s": grace_period_s}, f)

LAUNCHERS.register("recording", recording_launcher)
'''


def test_a_launcher_registered_by_a_plugin_module(tmp_path):
    """A launcher that a ``$DG_PLUGINS_IMPORT`` module registers is a ``--command_launcher``
    choice like the built-in ones, and gets the options it takes (``--stop_grace_period``); a
    typo lists it among the choices."""
    (tmp_path / "my_launcher_plugin.py").write_text(PLUGIN_LAUNCHER)
    record = tmp_path / "record.json"
    env = dict(os.environ, DG_PLUGINS_IMPORT="my_launcher_plugin", RECORD_TO=str(record),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    argv = sweep_argv(tmp_path, "recording", "--stop_grace_period", "7")
    done = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.sweep", *argv], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    launched = json.loads(record.read_text())
    assert len(launched["commands"]) == 3 and launched["grace_period_s"] == 7
    assert all(" -m dg_plugins.scripts.train " in c for c in launched["commands"])
    argv = sweep_argv(tmp_path, "recordin")
    done = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.sweep", *argv], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown --command_launcher 'recordin'; choices:" in done.stderr
    assert "recording" in done.stderr.splitlines()[-1]


def test_with_options_binds_only_what_a_launcher_takes():
    def domainbed_style(commands):
        return commands

    assert launchers.with_options(domainbed_style, grace_period_s=3) is domainbed_style
    bound = launchers.with_options(launchers.local_launcher, grace_period_s=3,
                                   submitit=submitit.SubmititOptions())
    assert bound.func is launchers.local_launcher and bound.keywords == {"grace_period_s": 3}
    assert launchers.with_options(launchers.local_launcher, grace_period_s=None) is \
        launchers.local_launcher


def test_dummy_launcher(capsys):
    launchers.dummy_launcher(["echo a", "echo b"])
    assert capsys.readouterr().out == "Dummy launcher: echo a\nDummy launcher: echo b\n"


def test_local_launcher_runs_all_and_reports_failures(tmp_path, capfd):
    commands = [write_cmd(tmp_path / "a"), write_cmd(tmp_path / "b", exit_code=3),
                write_cmd(tmp_path / "c")]
    with pytest.raises(processes.JobsFailed) as failure:  # once every job has run
        launchers.local_launcher(commands)
    assert failure.value.code == 1 and failure.value.failed == [commands[1]]
    assert all((tmp_path / name).exists() for name in "abc")
    out = capfd.readouterr().out
    assert "[1/3] " in out and "[3/3] " in out  # plain progress lines (stderr is not a tty)
    assert "local launcher: 1 of 3 commands failed:" in out
    assert f"exit code 3: {commands[1]}" in out


def test_a_jobs_output_stays_off_the_terminal_but_its_error_reaches_the_summary(tmp_path, capfd,
                                                                               monkeypatch):
    """The local launcher prints one line when a job starts and one when it ends; what the job
    printed goes to a temporary file, and a job that failed before writing its err.txt still gets
    its error line in the failure summary (taken from that output); the file is removed."""
    code = "import sys; print('Ar' + 'gs: 60 lines of settings'); sys.exit('error: no such tree')"
    folder = tmp_path / "job"
    command = f"{PY} -c {shlex.quote(code)} --output_dir {folder}"
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(processes.JobsFailed):
        launchers.local_launcher([command])
    out = capfd.readouterr().out
    assert "Args:" not in out
    assert f"[1/1] started: {command} (log: {folder / 'out.txt'})\n" in out
    assert re.search(r"\[1/1\] failed \(exit code 1\) in \d+ s: error: no such tree\n", out)
    assert (f"      error: no such tree\n      log: no err.txt in {folder} (the job failed before "
            "it took its folder: the lines above are from its output)") in out
    assert not list((tmp_path / "tmp").iterdir())


def test_visible_gpus_from_env(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3,,")
    assert launchers.visible_gpus() == ["0", "3"]


def test_multi_gpu_schedules_one_job_per_gpu(tmp_path, capfd):
    """Six jobs on fake GPUs 5 and 7: each sees exactly its GPU, a GPU never runs two jobs at
    once, both GPUs are used, failures are reported."""
    commands = []
    for i in range(6):
        code = ("import os, sys, time, json; t0 = time.time(); time.sleep(0.3); "
                f"json.dump([os.environ['CUDA_VISIBLE_DEVICES'], t0, time.time()], "
                f"open({str(tmp_path / str(i))!r}, 'w')); sys.exit({4 if i == 2 else 0})")
        commands.append(f"{PY} -c {shlex.quote(code)}")
    with pytest.raises(processes.JobsFailed):
        launchers.multi_gpu_launcher(commands, gpus=["5", "7"], poll_interval=0.02)
    runs = [json.loads((tmp_path / str(i)).read_text()) for i in range(6)]
    assert {gpu for gpu, _, _ in runs} == {"5", "7"}
    for gpu in ("5", "7"):
        spans = sorted((start, end) for g, start, end in runs if g == gpu)
        assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:]))
    out = capfd.readouterr().out
    assert "multi_gpu launcher: 1 of 6 commands failed:" in out and "exit code 4" in out


def test_multi_gpu_without_gpus_raises(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match="no GPU visible"):
        launchers.multi_gpu_launcher(["true"])


# ---------------------------------------------------------------------------------------------
# submitit


def test_submitit_options_precedence_and_defaults(monkeypatch):
    commands = ["python -m x --output_dir /sweeps/s1/abc --seed 1"]
    resolved = submitit.resolve_submitit_options(commands)
    # on Slurm the GPUs are fitted to the partition when submitting (tests/slurm/)
    assert (resolved.cluster, resolved.time_min, resolved.gpus_per_node, resolved.wait,
            resolved.signal_delay_s, resolved.max_requeues, resolved.jobs_per_task) == (
        "slurm", 1440, None, False, 120, 10, 1)
    assert resolved.log_dir == "/sweeps/s1/submitit_logs"
    assert submitit.resolve_submitit_options(
        overrides=submitit.SubmititOptions(cluster="local")).wait is True
    monkeypatch.setenv("DG_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("DG_SLURM_TIME", "60")
    monkeypatch.setenv("DG_SLURM_WAIT", "yes")
    monkeypatch.setenv("DG_SLURM_EXTRA", '{"slurm_account": "lab"}')
    # the sweep's --slurm_time (the launcher's options) wins over the env
    resolved = submitit.resolve_submitit_options(
        commands, overrides=submitit.SubmititOptions(time_min=30))
    assert (resolved.partition, resolved.time_min, resolved.wait, resolved.extra) == (
        "gpu", 30, True, {"slurm_account": "lab"})
    monkeypatch.setenv("DG_SLURM_TIME", "soon")
    with pytest.raises(ValueError, match="DG_SLURM_TIME"):
        submitit.resolve_submitit_options(commands)
    monkeypatch.delenv("DG_SLURM_TIME")
    with pytest.raises(ValueError, match="unknown submitit cluster"):
        submitit.resolve_submitit_options(
            overrides=submitit.SubmititOptions(cluster="pbs"))


def test_submitit_slurm_parameters(tmp_path, monkeypatch):
    """The Slurm executor receives partition, time, resources and array parallelism (a fake
    ``srun`` on PATH lets submitit build its Slurm executor here; nothing is submitted)."""
    pytest.importorskip("submitit")
    fake_srun = tmp_path / "bin" / "srun"
    fake_srun.parent.mkdir()
    fake_srun.write_text("#!/bin/sh\nexit 1\n")
    fake_srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_srun.parent}{os.pathsep}{os.environ['PATH']}")
    options = submitit.resolve_submitit_options(
        overrides=submitit.SubmititOptions(
            cluster="slurm", partition="gpu", time_min=90, gpus_per_node=1, cpus_per_task=4,
            mem_gb=16, array_parallelism=8, log_dir=str(tmp_path), extra={"slurm_qos": "high"},
            signal_delay_s=60, max_requeues=4))
    executor = submitit.make_executor(options)._executor
    params = executor.parameters
    assert (params["partition"], params["time"], params["gpus_per_node"], params["cpus_per_task"],
            params["array_parallelism"], params["qos"]) == ("gpu", 90, 1, 4, 8, "high")
    assert params["mem"] == "16GB"
    assert (params["signal_delay_s"], executor.max_num_timeout) == (60, 4)
    assert params["srun_args"] == ["--open-mode=append"]  # a requeued task's logs are kept


def test_submitit_missing_package_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(ImportError, match=r"dg_plugins\[slurm\]"):
        submitit.submit_commands(["true"], submitit.SubmititOptions(
            cluster="local", log_dir=str(tmp_path)))


@pytest.mark.parametrize("cluster", ["local", "debug"])
def test_submitit_executor_runs_real_commands(tmp_path, capfd, cluster):
    pytest.importorskip("submitit")
    work = tmp_path / "work"
    work.mkdir()
    commands = [write_cmd(Path("rel_a"), "os.getcwd()"), write_cmd(tmp_path / "b"),
                write_cmd(tmp_path / "c", exit_code=5)]
    cwd = os.getcwd()
    os.chdir(work)  # relative paths resolve against the directory of submission
    try:
        launcher = submitit.make_submitit_launcher(cluster=cluster, time_min=5,
                                                    log_dir=str(tmp_path / "logs"))
        with pytest.raises(processes.JobsFailed):
            launcher(commands)
    finally:
        os.chdir(cwd)
    assert (work / "rel_a").read_text() == str(work)
    assert (tmp_path / "b").exists() and (tmp_path / "c").exists()
    out = capfd.readouterr().out
    assert f"submitted 3 jobs to {cluster}" in out
    assert "submitit launcher: 1 of 3 commands failed:" in out and "exit code 5" in out
    assert cluster == "debug" or any((tmp_path / "logs").iterdir())


def test_a_submitit_launch_that_cannot_submit_here_is_refused_before_any_job_folder(
        tmp_path, capsys, monkeypatch):
    """The slurm cluster (the default) without Slurm's srun on PATH, and submitit not installed:
    each gets the usage line and one error with the fix, and no job folder is made (the first
    was submitit's traceback after the jobs' folders were claimed)."""
    pytest.importorskip("submitit")
    monkeypatch.delenv("DG_SLURM_CLUSTER", raising=False)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no srun, on any machine
    for hidden, error in ((False, "no Slurm on this machine (srun is not on PATH); run the jobs "
                           "here through submitit with --slurm_cluster local, or use "
                           "--command_launcher local"),
                          (True, "the submitit launcher needs the submitit package: pip install "
                           "'dg_plugins[slurm]'")):
        if hidden:
            monkeypatch.setitem(sys.modules, "submitit", None)
        with pytest.raises(SystemExit) as exit_info:
            sweep_cli.main(sweep_argv(tmp_path, "submitit"))
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2 and f"error: --command_launcher submitit: {error}" in lines[1], lines
        assert not (tmp_path / "out").exists()
    monkeypatch.delitem(sys.modules, "submitit")
    assert submitit.launch_problem(submitit.SubmititOptions(cluster="local")) is None


def test_sweep_through_submitit_local_with_real_jobs(tmp_path, capfd):
    """The sweep CLI with --command_launcher submitit on submitit's local executor: two real
    Debug28 jobs (one Incomplete, relaunched with --resume) run to Done; logs go to
    <output_dir>/submitit_logs; a relaunch finds nothing to do."""
    out_dir = tmp_path / "out"
    argv = ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
            "--n_trials", "1", "--single_source", "--output_dir", str(out_dir),
            "--data_dir", str(tmp_path / "data"), "--steps", "3",
            "--hparams", '{"batch_size": 8}', "--command_launcher", "submitit",
            "--slurm_cluster", "local", "--slurm_time", "10", "--skip_confirmation", "--resume"]
    args = jobs.make_args_list(1, ["Debug28"], ["ERM"], 0, 1, 3, str(tmp_path / "data"),
                                "domain_generalization", 0.2, False, '{"batch_size": 8}',
                                single_source=True)
    names = [jobs.job_folder_name(a) for a in args]
    (out_dir / names[0]).mkdir(parents=True)
    (out_dir / names[0] / "done").write_text("")  # pre-marked Done: skipped
    (out_dir / names[1]).mkdir()  # Incomplete: relaunched with --resume
    assert sweep_cli.main(argv) == 0
    out = capfd.readouterr().out
    assert "About to launch 2 jobs." in out and "all 2 commands succeeded" in out
    for name in names[1:]:
        records = (out_dir / name / "results.jsonl").read_text().splitlines()
        assert (out_dir / name / "done").exists() and len(records) == 2
    assert json.loads(records[0])["args"]["test_envs"] == [0, 1]  # source env 2
    assert any((out_dir / "submitit_logs").iterdir())
    assert sweep_cli.main(argv) == 0
    assert "3 jobs: 3 done, 0 incomplete, 0 not launched." in capfd.readouterr().out


# ---------------------------------------------------------------------------------------------
# Stop signals: SIGTERM / SIGINT to a sweep reach its running jobs once, no
# further job starts, the sweep waits for them (bounded), says how to continue, exits 128+sig.

FAKE_TRAIN = '''
"""A stand-in for train: traps SIGTERM/SIGINT, "writes a checkpoint", exits 128 + signal."""
import os, signal, sys, time
argv = sys.argv[1:]
out = argv[argv.index("--output_dir") + 1]
stubborn = os.environ.get("FAKE_TRAIN_MODE") == "stubborn"

def on_signal(signum, frame):
    with open(os.path.join(out, "signals"), "a") as f:
        f.write(f"{signum}\\n")
    if not stubborn:
        time.sleep(float(os.environ.get("FAKE_TRAIN_STEP_S", "0.3")))  # finish the step
        open(os.path.join(out, "checkpoint"), "w").write("step 7")
        sys.exit(128 + signum)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
with open(os.path.join(out, "pid.tmp"), "w") as f:  # closed here, not in a destructor, where
    f.write(str(os.getpid()))                        # the handler's SystemExit would be ignored
os.replace(os.path.join(out, "pid.tmp"), os.path.join(out, "pid"))
deadline = time.time() + 300  # "trains" until the test signals it (bounded: never a leftover)
while time.time() < deadline:
    time.sleep(0.02)
open(os.path.join(out, "done"), "w").write("done")
'''

# The sweep CLI, with jobs that run the fake train module instead of dg_plugins' train.
SWEEP_DRIVER = '''
import sys
from dg_plugins.sweep import cli, jobs
make_jobs = jobs.make_jobs
jobs.make_jobs = lambda args_list, out, **kw: make_jobs(args_list, out, module="fake_train", **kw)
sys.exit(cli.main(sys.argv[1:]))
'''


def sweep_argv(tmp_path, launcher, *extra):
    """Three Debug28 jobs (single source), all Not launched."""
    return ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
            "--n_trials", "1", "--single_source", "--output_dir", str(tmp_path / "out"),
            "--data_dir", str(tmp_path / "data"), "--command_launcher", launcher,
            "--skip_confirmation", *extra]


def start_sweep(tmp_path, argv, mode="graceful", env=None, new_session=False):
    (tmp_path / "fake").mkdir(exist_ok=True)
    (tmp_path / "fake" / "fake_train.py").write_text(FAKE_TRAIN)
    paths = [str(tmp_path / "fake"), *sys.path, *filter(None, [os.environ.get("PYTHONPATH")])]
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), FAKE_TRAIN_MODE=mode,
                   **(env or {}))
    # Output to files, not pipes: waiting for a pipe's end would also wait for the jobs (they
    # inherit it), hiding whether the sweep itself waited for them.
    with open(tmp_path / "sweep.out", "w") as out, open(tmp_path / "sweep.err", "w") as err:
        return subprocess.Popen([sys.executable, "-c", SWEEP_DRIVER, *argv], env=environ,
                                stdout=out, stderr=err, start_new_session=new_session,
                                preexec_fn=as_from_a_terminal)


def finish(tmp_path, proc, timeout=60):
    """Wait for the sweep process only; return its (stdout, stderr)."""
    proc.wait(timeout=timeout)
    return (tmp_path / "sweep.out").read_text(), (tmp_path / "sweep.err").read_text()


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def started_jobs(tmp_path, n=1):
    return wait_for(lambda: (lambda found: found if len(found) >= n else None)(
        sorted(p.parent for p in (tmp_path / "out").glob("*/pid"))))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # an unreaped zombie is not alive
        return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"


def expected_resume_line(argv):
    return " ".join([shlex.quote(sys.executable), "-m", "dg_plugins.scripts.sweep",
                     shlex.join(argv + ["--resume"])])


def check_interrupted_sweep(tmp_path, proc, argv, signum, n_running, checkpoint=True,
                            forwarded=None):
    stdout, stderr = finish(tmp_path, proc)
    assert proc.returncode == 128 + signum, stdout + stderr
    jobs = sorted(p.parent for p in (tmp_path / "out").glob("*/pid"))
    assert len(jobs) == n_running  # no job started after the signal
    for job in jobs:  # forwarded exactly once
        assert (job / "signals").read_text() == f"{forwarded or signum}\n"
        assert (job / "checkpoint").exists() == checkpoint and not (job / "done").exists()
        assert not alive(int((job / "pid").read_text()))  # nothing orphaned
    name = signal.Signals(signum).name
    assert f"Sweep stopped by {name}: {n_running} job(s) interrupted, " \
           f"{3 - n_running} not started." in stdout
    # the jobs never started are Not launched again: no folder (it was Incomplete, empty)
    assert sorted(p for p in (tmp_path / "out").iterdir() if len(p.name) == 32) == jobs
    for job in jobs:
        assert f"  interrupted: {job} " in stdout
    assert "To continue them (interrupted jobs resume from their last checkpoint):" in stdout
    assert expected_resume_line(argv) in stdout
    assert "Launched" not in stdout and "Traceback" not in stderr
    return stdout, stderr


@pytest.mark.parametrize("signum, forwarded", [
    (signal.SIGTERM, None), (signal.SIGINT, None),
    (signal.SIGHUP, signal.SIGTERM),  # the terminal closed: the job must still stop cleanly
])
def test_signal_to_local_sweep_stops_the_running_job(tmp_path, signum, forwarded):
    argv = sweep_argv(tmp_path, "local")
    proc = start_sweep(tmp_path, argv)
    started_jobs(tmp_path)
    os.kill(proc.pid, signum)
    check_interrupted_sweep(tmp_path, proc, argv, signum, n_running=1, forwarded=forwarded)


def test_ctrl_c_to_the_whole_process_group_reaches_the_job_once(tmp_path):
    """A terminal's Ctrl-C signals the sweep's whole process group: the job, in its own
    group, gets the forwarded SIGINT only, not a second copy."""
    argv = sweep_argv(tmp_path, "local")
    proc = start_sweep(tmp_path, argv, new_session=True)
    started_jobs(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    check_interrupted_sweep(tmp_path, proc, argv, signal.SIGINT, n_running=1)


def test_job_ignoring_the_signal_is_killed_after_the_grace_period(tmp_path):
    argv = sweep_argv(tmp_path, "local", "--stop_grace_period", "1")
    proc = start_sweep(tmp_path, argv, mode="stubborn")
    started_jobs(tmp_path)
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    stdout, _ = check_interrupted_sweep(tmp_path, proc, argv, signal.SIGTERM, n_running=1,
                                        checkpoint=False)
    assert 1.0 <= time.monotonic() - start < 20
    assert "still running after the 1 s grace period: killed (SIGKILL)" in stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_sweep_sends_sigterm_to_its_job_started_through_the_shell(tmp_path):
    """A job started through the shell (any command but this interpreter's train, which
    tests/sweep/test_sweep_failures.py kills the same way) gets SIGTERM from the kernel when
    the sweep dies by SIGKILL, stops at a checkpoint and exits (it used to train on)."""
    argv = sweep_argv(tmp_path, "local")
    proc = start_sweep(tmp_path, argv)
    [job] = started_jobs(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    pid = int((job / "pid").read_text())
    wait_for(lambda: not alive(pid), timeout=30)
    assert (job / "signals").read_text() == "15\n" and (job / "checkpoint").exists()
    assert not (job / "done").exists()


def test_signal_to_multi_gpu_sweep_stops_every_running_job(tmp_path):
    argv = sweep_argv(tmp_path, "multi_gpu")
    proc = start_sweep(tmp_path, argv, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    started_jobs(tmp_path, n=2)
    os.kill(proc.pid, signal.SIGTERM)
    check_interrupted_sweep(tmp_path, proc, argv, signal.SIGTERM, n_running=2)


def test_signal_to_submitit_local_sweep_leaves_no_local_process(tmp_path):
    """submitit's local executor runs the jobs on this machine: the signal reaches them (through
    submitit's controller and our task wrapper), they stop at a checkpoint and nothing is left
    running; the sweep exits 143."""
    pytest.importorskip("submitit")
    argv = sweep_argv(tmp_path, "submitit", "--slurm_cluster", "local", "--slurm_time", "5")
    proc = start_sweep(tmp_path, argv)
    started_jobs(tmp_path, n=3)  # the local executor starts every job at once
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = finish(tmp_path, proc, timeout=90)
    assert proc.returncode == 143, stdout + stderr
    for job in sorted(p.parent for p in (tmp_path / "out").glob("*/pid")):
        assert (job / "signals").read_text() == "15\n" and (job / "checkpoint").exists()
        assert not alive(int((job / "pid").read_text()))
    assert "Sweep stopped by SIGTERM: 3 job(s) interrupted, 0 not started." in stdout
    assert expected_resume_line(argv) in stdout


def test_signal_to_submitit_debug_sweep_stops_the_running_job(tmp_path):
    """The debug executor runs jobs one by one inside the sweep: the running one gets the signal,
    the others never start."""
    pytest.importorskip("submitit")
    argv = sweep_argv(tmp_path, "submitit", "--slurm_cluster", "debug")
    proc = start_sweep(tmp_path, argv)
    started_jobs(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    check_interrupted_sweep(tmp_path, proc, argv, signal.SIGTERM, n_running=1)


SLURM_WAIT_DRIVER = '''
import sys, time
from dg_plugins.sweep import processes, submitit

class SlurmJob:  # a job that runs on the cluster: waiting on it blocks
    job_id = "4242_0"
    def exception(self):
        print("waiting", flush=True)
        time.sleep(60)

try:
    submitit._wait_slurm(["cmd a", "cmd b"], [SlurmJob(), SlurmJob()])
except processes.LaunchInterrupted as err:
    print(err.code, err.remote, err.interrupted, err.not_started, err.notes)
    raise
'''


def test_signal_while_waiting_for_slurm_jobs_stops_only_the_waiting():
    """On Slurm the jobs live on the cluster: a signal ends the wait at once (no local child
    to stop), names them and says how to cancel them; the status is 128 + signal."""
    proc = subprocess.Popen([sys.executable, "-c", SLURM_WAIT_DRIVER], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    assert proc.stdout.readline() == "waiting\n"
    os.kill(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert stdout.strip() == ("130 True ['cmd a', 'cmd b'] [] ['the jobs keep running on the "
                              "cluster; cancel them with: scancel 4242']")


def test_is_simple_command():
    assert fork.is_simple_command(f"{PY} -m x --hparams '{{\"a\": 1}}' --test_envs 0 1")
    for command in ("cd /tmp && python x", "A=1 python x", "python x > log", "echo $HOME",
                    "python x; python y", 'python "x"', "exit 3", ""):
        assert not fork.is_simple_command(command), command


def test_compound_command_is_waited_for_as_a_whole(tmp_path):
    """A command that keeps the shell as parent (here ``cd ... && python ...``): the signal
    reaches the job through its process group; the launcher returns only once the job itself
    (not just the shell, which SIGTERM kills at once) has stopped."""
    (tmp_path / "out" / "job").mkdir(parents=True)
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    command = (f"cd {shlex.quote(str(tmp_path))} && {PY} fake_train.py "
               f"--output_dir {shlex.quote(str(tmp_path / 'out' / 'job'))}")
    driver = ("import sys; from dg_plugins.sweep import launchers; "
              "launchers.local_launcher(sys.argv[1:])")
    with open(tmp_path / "sweep.out", "w") as out, open(tmp_path / "sweep.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", driver, command], stdout=out, stderr=err,
                                env=dict(os.environ, FAKE_TRAIN_STEP_S="1.5"))
    [job] = started_jobs(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = finish(tmp_path, proc)
    assert proc.returncode == 143, stderr
    assert (job / "signals").read_text() == "15\n" and (job / "checkpoint").exists()
    assert not alive(int((job / "pid").read_text()))
    assert "local launcher: stopped by SIGTERM: 1 interrupted, 0 not started" in stdout


def test_forkable_train_args_accepts_only_this_interpreters_train(monkeypatch):
    """The sweep's own train command is forked from the preloaded server; anything else (another
    interpreter, another module, a compound command) or ``DG_PLUGINS_FORK_JOBS=0`` starts a
    fresh process through the shell."""
    monkeypatch.delenv(fork.FORK_ENV, raising=False)
    command = f"{PY} -m dg_plugins.scripts.train --dataset Debug28 --steps 3"
    assert fork.forkable_train_args(command) == ["--dataset", "Debug28", "--steps", "3"]
    for other in (f"/usr/bin/python9 -m dg_plugins.scripts.train --steps 3",
                  f"{PY} -m dg_plugins.scripts.sweep launch",
                  f"{PY} fake_train.py --steps 3",
                  f"cd /tmp && {PY} -m dg_plugins.scripts.train --steps 3"):
        assert fork.forkable_train_args(other) is None, other
    monkeypatch.setenv(fork.FORK_ENV, "0")
    assert fork.forkable_train_args(command) is None


def test_forked_train_reports_its_exit_status_and_the_signal_that_ended_it(tmp_path):
    """A forked job's ``returncode`` is train's exit status (2 for a usage error, as a fresh
    interpreter gives) and ``-N`` when signal N killed it, as ``Popen`` reports."""
    bad = fork.fork_train(["--dataset", "Debug28", "--algorithm", "NoSuchAlgorithm",
                                "--output_dir", str(tmp_path / "bad")], new_session=True)
    assert bad.wait(timeout=120) == 2
    assert not alive(bad.pid)
    running = fork.fork_train(["--dataset", "Debug28", "--algorithm", "ERM", "--steps",
                                    "100000", "--output_dir", str(tmp_path / "long")],
                                   new_session=True)
    assert running.poll() is None
    deadline = time.time() + 120
    while not (tmp_path / "long" / "out.txt").exists() and time.time() < deadline:
        time.sleep(0.2)
    os.kill(running.pid, signal.SIGKILL)
    assert running.wait(timeout=60) == -signal.SIGKILL
    assert not alive(running.pid)
