"""Launchers (spec 8.3): dummy, local, multi_gpu (fake GPU ids), submitit (local/debug executors
running real commands, so the code path Slurm uses is the one exercised)."""

import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from dg_plugins.engine import launchers, sweep
from dg_plugins.registry import LAUNCHERS
from dg_plugins.scripts import sweep as sweep_cli

HAS_TRAIN = importlib.util.find_spec("dg_plugins.scripts.train") is not None
PY = shlex.quote(sys.executable)


@pytest.fixture(autouse=True)
def _fresh_submitit_options(monkeypatch):
    for var in launchers.SUBMITIT_ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    launchers.configure_submitit(reset=True)
    yield
    launchers.configure_submitit(reset=True)


def write_cmd(path: Path, text: str = "'ok'", exit_code: int = 0) -> str:
    """A shell command that writes ``text`` (a Python expression) to ``path``, then exits."""
    code = f"import os, sys; open({str(path)!r}, 'w').write(str({text})); sys.exit({exit_code})"
    return f"{PY} -c {shlex.quote(code)}"


def test_registered_launchers():
    assert {"dummy", "local", "multi_gpu", "submitit"} <= set(LAUNCHERS.list())
    assert LAUNCHERS.get("local") is launchers.local_launcher


def test_dummy_launcher(capsys):
    launchers.dummy_launcher(["echo a", "echo b"])
    assert capsys.readouterr().out == "Dummy launcher: echo a\nDummy launcher: echo b\n"


def test_local_launcher_runs_all_and_reports_failures(tmp_path, capfd):
    commands = [write_cmd(tmp_path / "a"), write_cmd(tmp_path / "b", exit_code=3),
                write_cmd(tmp_path / "c")]
    launchers.local_launcher(commands)  # does not raise
    assert all((tmp_path / name).exists() for name in "abc")
    out = capfd.readouterr().out
    assert "[1/3] " in out and "[3/3] " in out  # plain progress lines (stderr is not a tty)
    assert "local launcher: 1 of 3 commands failed:" in out
    assert f"exit code 3: {commands[1]}" in out


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
    resolved = launchers.resolve_submitit_options(commands)
    assert (resolved.cluster, resolved.time_min, resolved.gpus_per_node, resolved.wait) == (
        "slurm", 1440, 1, False)
    assert resolved.log_dir == "/sweeps/s1/submitit_logs"
    assert launchers.resolve_submitit_options(
        overrides=launchers.SubmititOptions(cluster="local")).wait is True
    monkeypatch.setenv("DG_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("DG_SLURM_TIME", "60")
    monkeypatch.setenv("DG_SLURM_WAIT", "yes")
    monkeypatch.setenv("DG_SLURM_EXTRA", '{"slurm_account": "lab"}')
    launchers.configure_submitit(time_min=30)  # the sweep's --slurm_time wins over the env
    resolved = launchers.resolve_submitit_options(commands)
    assert (resolved.partition, resolved.time_min, resolved.wait, resolved.extra) == (
        "gpu", 30, True, {"slurm_account": "lab"})
    monkeypatch.setenv("DG_SLURM_TIME", "soon")
    with pytest.raises(ValueError, match="DG_SLURM_TIME"):
        launchers.resolve_submitit_options(commands)
    monkeypatch.delenv("DG_SLURM_TIME")
    with pytest.raises(ValueError, match="unknown submitit cluster"):
        launchers.resolve_submitit_options(overrides=launchers.SubmititOptions(cluster="pbs"))


def test_submitit_slurm_parameters(tmp_path, monkeypatch):
    """The Slurm executor receives partition, time, resources and array parallelism (a fake
    ``srun`` on PATH lets submitit build its Slurm executor here; nothing is submitted)."""
    pytest.importorskip("submitit")
    fake_srun = tmp_path / "bin" / "srun"
    fake_srun.parent.mkdir()
    fake_srun.write_text("#!/bin/sh\nexit 1\n")
    fake_srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_srun.parent}{os.pathsep}{os.environ['PATH']}")
    options = launchers.resolve_submitit_options(overrides=launchers.SubmititOptions(
        cluster="slurm", partition="gpu", time_min=90, cpus_per_task=4, mem_gb=16,
        array_parallelism=8, log_dir=str(tmp_path), extra={"slurm_qos": "high"}))
    params = launchers.make_executor(options)._executor.parameters
    assert (params["partition"], params["time"], params["gpus_per_node"], params["cpus_per_task"],
            params["array_parallelism"], params["qos"]) == ("gpu", 90, 1, 4, 8, "high")
    assert params["mem"] == "16GB"


def test_submitit_missing_package_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(ImportError, match=r"dg_plugins\[slurm\]"):
        launchers.submit_commands(["true"], launchers.SubmititOptions(
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
        launcher = launchers.make_submitit_launcher(cluster=cluster, time_min=5,
                                                    log_dir=str(tmp_path / "logs"))
        launcher(commands)
    finally:
        os.chdir(cwd)
    assert (work / "rel_a").read_text() == str(work)
    assert (tmp_path / "b").exists() and (tmp_path / "c").exists()
    out = capfd.readouterr().out
    assert f"submitted 3 jobs to {cluster}" in out
    assert "submitit launcher: 1 of 3 commands failed:" in out and "exit code 5" in out
    assert cluster == "debug" or any((tmp_path / "logs").iterdir())


@pytest.mark.skipif(not HAS_TRAIN, reason="dg_plugins.scripts.train not available yet")
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
    args = sweep.make_args_list(1, ["Debug28"], ["ERM"], 0, 1, 3, str(tmp_path / "data"),
                                "domain_generalization", 0.2, False, '{"batch_size": 8}',
                                single_source=True)
    names = [sweep.job_folder_name(a) for a in args]
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
