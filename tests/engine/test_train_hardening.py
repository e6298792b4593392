"""train as a demanding user meets it: bad step counts, crashes during checkpoint writes, reruns of
finished jobs, resumes with other arguments, lost or torn records, signals, and two processes on
one folder. Each test reproduces a failure that the host used to have."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dg_plugins.engine import train
from dg_plugins.registry import ALGORITHMS
from dg_plugins.scripts.train import build_parser, main
from helpers import read_records

TINY = '{"batch_size": 8}'
TIMING_KEYS = {"step_time", "mem_gb"}
HERE = Path(__file__).resolve().parent


def args_for(out, *extra, dataset="Debug28"):
    return build_parser().parse_args(["--dataset", dataset, "--output_dir", str(out),
                                      "--hparams", TINY, *extra])


def comparable(recs):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS | {"args"}} for r in recs]


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent), str(HERE.parent / "plugins"), env.get("PYTHONPATH", "")])
    env["DG_PLUGINS_IMPORT"] = "big_state_algorithm"
    return env


def spawn(out, *extra, dataset="RotatedMNIST5k", steps="200", freq="20",
          hparams='{"batch_size": 16}'):
    cmd = [sys.executable, "-m", "dg_plugins.scripts.train", "--dataset", dataset,
           "--steps", steps, "--checkpoint_freq", freq, "--hparams", hparams,
           "--output_dir", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())


def wait_for(predicate, timeout=120.0, interval=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


# bad numeric flags are refused -------------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [("--steps", "-5"), ("--steps", "0"),
                                         ("--checkpoint_freq", "0"), ("--checkpoint_freq", "-5")])
def test_non_positive_step_counts_are_rejected_before_anything_is_written(tmp_path, capsys,
                                                                          flag, value):
    out = tmp_path / "job"
    assert main(["--dataset", "Debug28", "--output_dir", str(out), flag, value]) == 2
    assert f"{flag} must be a positive integer, got {value}" in capsys.readouterr().err
    assert not out.exists()


# a crash prints its traceback once ---------------------------------------------------------------

def test_a_crash_prints_its_traceback_once(tmp_path):
    out = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys, big_state_algorithm; from dg_plugins.scripts.train import main; "
         f"sys.exit(main(['--dataset', 'CrashingData', '--output_dir', {str(out)!r}, "
         "'--steps', '3', '--hparams', '{\"batch_size\": 4}']))"],
        capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert console.count("Traceback (most recent call last)") == 1, console
    assert "decoder exploded on item" in console
    assert (out / "err.txt").read_text().count("Traceback (most recent call last)") == 1


# a kill during a checkpoint write leaves no temporary file ---------------------------------------

def test_sigkill_during_a_checkpoint_write_leaves_no_temporary_file_after_resume(tmp_path):
    """A real kill -9 while checkpoint.pt is being written (a 64 MB buffer makes the write last):
    the temporary file is left behind; --resume removes it, says so, and finishes the job."""
    out = tmp_path / "job"
    common = ["--algorithm", "BigStateERM"]
    for _ in range(5):  # the write window is short: retry until the kill lands inside it
        proc = spawn(out, *common, dataset="Debug28", steps="60", freq="2", hparams=TINY)
        caught = wait_for(lambda: any(p.name.startswith(".tmp-") for p in out.glob(".tmp-*")),
                          timeout=180, interval=0.001)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        if caught and list(out.glob(".tmp-*")):
            break
    leftovers = list(out.glob(".tmp-*"))
    assert leftovers, "could not kill the job during a checkpoint write"
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--steps", "60",
                 "--checkpoint_freq", "2", "--hparams", TINY, *common, "--resume"]) == 0
    assert not list(out.glob(".tmp-*"))
    assert "removed a leftover temporary file" in (out / "err.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == [
        "done", "err.txt", "model.pkl", "out.txt", "results.jsonl"]


# a finished job is not rerun unless forced -------------------------------------------------------

def test_rerunning_a_finished_job_refuses_and_force_starts_over(tmp_path, capsys):
    out = tmp_path / "job"
    assert train.run(args_for(out, "--steps", "3")) == "done"
    before = (out / "results.jsonl").read_bytes()
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--hparams", TINY,
                 "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished job" in err and "--force" in err
    assert (out / "results.jsonl").read_bytes() == before and (out / "done").exists()
    # --force removes done first: an interrupted forced rerun is never counted as done
    assert train.run(args_for(out, "--steps", "5", "--checkpoint_freq", "2", "--force"),
                     stop_after_step=2) == "stopped"
    assert not (out / "done").exists()
    assert [r["step"] for r in read_records(out)] == [0, 2]
    assert train.run(args_for(out, "--steps", "5", "--checkpoint_freq", "2", "--resume")) == "done"
    assert [r["step"] for r in read_records(out)] == [0, 2, 4]


def test_records_of_an_interrupted_run_need_resume_or_force(tmp_path, capsys):
    out = tmp_path / "job"
    assert train.run(args_for(out, "--steps", "5", "--checkpoint_freq", "2"),
                     stop_after_step=0) == "stopped"
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--hparams", TINY,
                 "--steps", "5", "--checkpoint_freq", "2"]) == 2
    assert "records of an interrupted run; continue it with --resume" in capsys.readouterr().err
    assert len(read_records(out)) == 1


# --resume refuses other arguments than the interrupted run's -------------------------------------

@pytest.mark.parametrize("changed, listed", [
    (["--seed", "1"], "--seed: 0 in the checkpoint, 1 now"),
    (["--test_envs", "1"], "--test_envs: [0] in the checkpoint, [1] now"),
    (["--steps", "9"], "--steps: 7 in the checkpoint, 9 now"),
    (["--hparams", '{"batch_size": 8, "lr": 0.01}'], "hparam lr: 0.001 in the checkpoint, 0.01 now"),
])
def test_resume_with_other_arguments_refuses_and_lists_the_differences(tmp_path, capsys,
                                                                        changed, listed):
    out = tmp_path / "job"
    base = ["--dataset", "Debug28", "--output_dir", str(out), "--hparams", TINY,
            "--steps", "7", "--checkpoint_freq", "2"]
    assert train.run(build_parser().parse_args(base), stop_after_step=2) == "stopped"
    kept = (out / "results.jsonl").read_bytes()
    argv = base + changed + ["--resume"]
    assert main(argv) == 2
    err = "".join(capsys.readouterr())  # reported through DomainBed's Tee: err.txt and stdout
    assert "--resume with other arguments" in err and listed in err
    assert (out / "results.jsonl").read_bytes() == kept


def test_resume_in_a_moved_folder_is_allowed(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    assert train.run(args_for(first, "--steps", "7", "--checkpoint_freq", "2"),
                     stop_after_step=2) == "stopped"
    first.rename(moved)
    assert train.run(args_for(moved, "--steps", "7", "--checkpoint_freq", "2", "--resume")) == "done"
    full = tmp_path / "full"
    assert train.run(args_for(full, "--steps", "7", "--checkpoint_freq", "2")) == "done"
    assert comparable(read_records(moved)) == comparable(read_records(full))


# --resume refuses records that do not match the checkpoint ---------------------------------------

def test_resume_refuses_when_a_counted_record_is_missing(tmp_path, capsys):
    out = tmp_path / "job"
    assert train.run(args_for(out, "--steps", "7", "--checkpoint_freq", "2"),
                     stop_after_step=4) == "stopped"
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:-1]))  # the OS lost the last record
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--hparams", TINY,
                 "--steps", "7", "--checkpoint_freq", "2", "--resume"]) == 2
    assert "holds 2 complete records but the checkpoint counts 3" in "".join(capsys.readouterr())


def test_resume_drops_a_torn_line_after_the_counted_records(tmp_path):
    out, full = tmp_path / "job", tmp_path / "full"
    assert train.run(args_for(out, "--steps", "7", "--checkpoint_freq", "2"),
                     stop_after_step=2) == "stopped"
    with open(out / "results.jsonl", "a") as f:
        f.write('{"step": 4, "env0_in_acc": 0.')  # a crash mid-append
    assert train.run(args_for(out, "--steps", "7", "--checkpoint_freq", "2", "--resume")) == "done"
    assert train.run(args_for(full, "--steps", "7", "--checkpoint_freq", "2")) == "done"
    assert comparable(read_records(out)) == comparable(read_records(full))


def test_each_record_is_synced_before_the_checkpoint_that_counts_it(tmp_path, monkeypatch):
    events = []
    from dg_plugins.engine import checkpoint

    real_fsync, real_save = os.fsync, checkpoint.atomic_torch_save

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def save(obj, path):
        events.append(("checkpoint" if path.endswith("checkpoint.pt") else "save", path))
        return real_save(obj, path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(checkpoint, "atomic_torch_save", save)
    assert train.run(args_for(tmp_path, "--steps", "3", "--checkpoint_freq", "1")) == "done"
    order = [kind if kind != "fsync" or not path.endswith("results.jsonl") else "record"
             for kind, path in events if kind != "save" and (kind != "fsync" or
                                                             path.endswith("results.jsonl"))]
    assert order == ["record", "checkpoint"] * 3


# SIGTERM stops at a step boundary; --resume continues --------------------------------------------

def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint_and_resume_continues(tmp_path):
    out, full = tmp_path / "job", tmp_path / "full"
    proc = spawn(out)
    assert wait_for(lambda: len(read_records(out)) >= 2)
    proc.send_signal(signal.SIGTERM)
    console = "".join(proc.communicate(timeout=120))
    assert proc.returncode == 143, console
    assert "stopped by SIGTERM" in console and "--resume" in console
    assert "stopped by SIGTERM" in (out / "err.txt").read_text()
    assert (out / "checkpoint.pt").exists() and not (out / "done").exists()
    resume = spawn(out, "--resume")
    resume.communicate(timeout=600)
    assert resume.returncode == 0
    reference = spawn(full)
    reference.communicate(timeout=600)
    assert comparable(read_records(out)) == comparable(read_records(full))


# one process per job folder ----------------------------------------------------------------------

def test_a_second_process_on_a_busy_folder_fails_and_the_first_is_unharmed(tmp_path):
    out = tmp_path / "job"
    first = spawn(out, steps="150", freq="50")
    assert wait_for(lambda: (out / ".lock").exists() and (out / "results.jsonl").exists())
    second = subprocess.run(
        [sys.executable, "-m", "dg_plugins.scripts.train", "--dataset", "RotatedMNIST5k",
         "--steps", "150", "--checkpoint_freq", "50", "--hparams", '{"batch_size": 16}',
         "--output_dir", str(out), "--resume"],
        capture_output=True, text=True, env=child_env(), timeout=300)
    assert second.returncode == 2
    assert "is in use by another train process (pid" in second.stderr
    first.communicate(timeout=600)
    assert first.returncode == 0
    assert [r["step"] for r in read_records(out)] == [0, 50, 100, 149]
    assert not (out / ".lock").exists()


@pytest.fixture(autouse=True, scope="module")
def _test_plugins():
    sys.path.insert(0, str(HERE))
    import big_state_algorithm  # noqa: F401  (registers BigStateERM, CrashingData)

    yield
    ALGORITHMS.unregister("BigStateERM")
