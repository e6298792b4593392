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

from dg_plugins.train import run as train
from dg_plugins.scripts.train import build_parser, main
from support.helpers import read_records
from support.job_gate import gate_vars, released

TINY = '{"batch_size": 8}'
TIMING_KEYS = {"step_time", "mem_gb"}
HERE = Path(__file__).resolve().parent


def args_for(out, *extra, dataset="Debug28"):
    return build_parser().parse_args(["--dataset", dataset, "--output_dir", str(out),
                                      "--hparams", TINY, *extra])


def comparable(recs):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS | {"args"}} for r in recs]


#: One job that several tests interrupt (a signal, a full disk, a torn record, a moved folder)
#: and resume; ``uninterrupted_run`` holds the records it writes run without interruption.
REFERENCE_STEPS = ["--steps", "5", "--checkpoint_freq", "2"]
REFERENCE_RUN = ["--dataset", "Debug28", "--hparams", TINY, *REFERENCE_STEPS]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
    """The records of ``REFERENCE_RUN`` run without interruption."""
    out = tmp_path_factory.mktemp("uninterrupted") / "job"
    assert main(REFERENCE_RUN + ["--output_dir", str(out)]) == 0
    records = read_records(out)
    assert [r["step"] for r in records] == [0, 2, 4]
    return records


@pytest.fixture(scope="module")
def stopped_job(tmp_path_factory):
    """A folder of ``REFERENCE_RUN`` stopped after step 2 (records 0 and 2, a checkpoint); tests
    take a copy of it (:func:`copy_of_stopped`), as a job stopped in their own folder."""
    out = tmp_path_factory.mktemp("stopped") / "job"
    assert train.run(args_for(out, *REFERENCE_STEPS), stop_after_step=2) == "stopped"
    assert [r["step"] for r in read_records(out)] == [0, 2]
    return out


def copy_of_stopped(stopped_job, out):
    """``out``: a copy of the stopped reference job (what ``train.run(args_for(out,
    *REFERENCE_STEPS), stop_after_step=2)`` leaves), made without training again."""
    import shutil

    shutil.copytree(stopped_job, out)
    return out


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent), str(HERE.parent / "plugins"), env.get("PYTHONPATH", "")])
    env["DG_PLUGINS_IMPORT"] = "support.big_state_algorithm"
    return env


def spawn(out, *extra, dataset="Debug28", steps="5", freq="2", hparams=TINY, gate=None):
    """Start train; ``gate``: the keyword arguments of ``job_gate.gate_vars`` that hold it."""
    cmd = [sys.executable, "-m", "dg_plugins.scripts.train", "--dataset", dataset,
           "--steps", steps, "--checkpoint_freq", freq, "--hparams", hparams,
           "--output_dir", str(out), *extra]
    env = child_env()
    if gate is not None:
        env.update(gate_vars(plugins=env["DG_PLUGINS_IMPORT"], **gate))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


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

def test_a_crash_prints_its_traceback_once(tmp_path, capsys):
    """(In-process: the traceback is train's own report; no exception leaves ``main``, so the
    interpreter of the command prints none after it.)"""
    out = tmp_path / "job"
    assert main(["--dataset", "CrashingData", "--output_dir", str(out), "--steps", "3",
                 "--hparams", '{"batch_size": 4}']) == 1
    console = "".join(capsys.readouterr())
    assert console.count("Traceback (most recent call last)") == 1, console
    assert "decoder exploded on item" in console
    assert (out / "err.txt").read_text().count("Traceback (most recent call last)") == 1


# a kill during a checkpoint write leaves no temporary file ---------------------------------------

def test_sigkill_during_a_checkpoint_write_leaves_no_temporary_file_after_resume(tmp_path):
    """A real kill -9 while checkpoint.pt is being written (the test's gate holds the job in its
    first checkpoint write, after the temporary file is written and before the rename): the
    temporary file is left behind; --resume removes it, says so, and finishes the job."""
    out, gate = tmp_path / "job", tmp_path / "gate"
    gate.mkdir()
    proc = spawn(out, steps="4", gate={"folder": gate, "write": "checkpoint.pt"})
    with released(gate):
        assert wait_for(lambda: (gate / "waiting").exists(), timeout=180)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert len(list(out.glob(".tmp-*checkpoint.pt"))) == 1
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--steps", "4",
                 "--checkpoint_freq", "2", "--hparams", TINY, "--resume"]) == 0
    assert not list(out.glob(".tmp-*"))
    assert "removed a leftover temporary file" in (out / "err.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == [
        "done", "err.txt", "model.pkl", "out.txt", "results.jsonl"]


# a finished job is not rerun unless forced -------------------------------------------------------

def test_rerunning_a_finished_job_refuses_and_force_starts_over(tmp_path, capsys):
    """--force also starts the logs over: err.txt of the forced rerun holds only its own run (it
    kept the old errors), out.txt one run's arguments."""
    out = tmp_path / "job"
    assert train.run(args_for(out, "--steps", "3")) == "done"
    before = (out / "results.jsonl").read_bytes()
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--hparams", TINY,
                 "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished job" in err and "--force" in err
    assert (out / "results.jsonl").read_bytes() == before and (out / "done").exists()
    with open(out / "err.txt", "a") as f:
        f.write("error: an old failure\n")
    # --force removes done first: an interrupted forced rerun is never counted as done
    assert train.run(args_for(out, "--steps", "5", "--checkpoint_freq", "2", "--force"),
                     stop_after_step=2) == "stopped"
    assert not (out / "done").exists()
    assert "an old failure" not in (out / "err.txt").read_text()
    assert (out / "out.txt").read_text().count("Args:") == 1
    assert [r["step"] for r in read_records(out)] == [0, 2]
    assert train.run(args_for(out, "--steps", "5", "--checkpoint_freq", "2", "--resume")) == "done"
    assert [r["step"] for r in read_records(out)] == [0, 2, 4]


def test_records_of_an_interrupted_run_need_resume_or_force(tmp_path, capsys, stopped_job):
    out = copy_of_stopped(stopped_job, tmp_path / "job")
    assert main(REFERENCE_RUN + ["--output_dir", str(out)]) == 2
    assert "records of an interrupted run; continue it with --resume" in capsys.readouterr().err
    assert len(read_records(out)) == 2


# --resume refuses other arguments than the interrupted run's -------------------------------------

@pytest.mark.parametrize("changed, listed", [
    (["--seed", "1"], "--seed: 0 in the checkpoint, 1 now"),
    (["--test_envs", "1"], "--test_envs: [0] in the checkpoint, [1] now"),
    (["--steps", "9"], "--steps: 5 in the checkpoint, 9 now"),
    (["--hparams", '{"batch_size": 8, "lr": 0.01}'], "hparam lr: 0.001 in the checkpoint, 0.01 now"),
])
def test_resume_with_other_arguments_refuses_and_lists_the_differences(tmp_path, capsys,
                                                                        stopped_job, changed,
                                                                        listed):
    out = copy_of_stopped(stopped_job, tmp_path / "job")
    base = REFERENCE_RUN + ["--output_dir", str(out)]
    kept = (out / "results.jsonl").read_bytes()
    argv = base + changed + ["--resume"]
    assert main(argv) == 2
    err = "".join(capsys.readouterr())  # reported through DomainBed's Tee: err.txt and stdout
    assert "--resume with other arguments" in err and listed in err
    assert (out / "results.jsonl").read_bytes() == kept


@pytest.mark.parametrize("first, again, listed", [
    (["--deterministic", "false", "--eval_batch_size", "32"], ["--deterministic", "true"],
     ["--deterministic: False in the checkpoint, True now (the default)",  # given at its default
      "--eval_batch_size: 32 in the checkpoint, 64 now (the default)"]),  # not given
    ([], ["--eval_splits", "selection"],
     ["--eval_splits: 'all' in the checkpoint (the default), 'selection' now"]),
])
def test_a_resume_difference_names_a_default_value_not_none(tmp_path, capsys, stopped_job,
                                                            first, again, listed):
    """A flag left out of a job's args at its default (compute settings, evaluation flags),
    whether not given or given at its default, is named by its default value."""
    out = tmp_path / "job"
    base = REFERENCE_RUN + ["--output_dir", str(out)]
    if first:
        assert train.run(build_parser().parse_args(base + first), stop_after_step=2) == "stopped"
    else:  # the reference job, stopped with every flag at its default
        copy_of_stopped(stopped_job, out)
    assert main(base + again + ["--resume"]) == 2
    err = "".join(capsys.readouterr())
    assert all(line in err for line in listed), err
    assert "None" not in err.split("--resume with other arguments")[1], err


def test_every_flag_left_out_at_its_default_is_named_by_its_default():
    """The rule, for every compute setting and evaluation flag (and ``not given`` for another
    flag absent from one side)."""
    from dg_plugins.job.flags import COMPUTE_DEFAULTS
    from dg_plugins.train.checkpoint import checkpoint_differences
    from dg_plugins.job.flags import EVAL_DEFAULTS

    now = {"algorithm": "ERM", "dataset": "Debug28", "seed": 0}
    hparams = {"lr": 0.1}
    other = {"precision": "bf16", "channels_last": True, "deterministic": False,
             "augment_on": "device", "eval_splits": "selection", "eval_batch_size": 32}
    assert set(other) == set(COMPUTE_DEFAULTS) | set(EVAL_DEFAULTS)
    for key, value in other.items():
        default = {**COMPUTE_DEFAULTS, **EVAL_DEFAULTS}[key]
        old = {"args": dict(now, **{key: value}), "hparams": hparams}
        assert checkpoint_differences(old, now, hparams) == [
            f"--{key}: {value!r} in the checkpoint, {default!r} now (the default)"]
        assert checkpoint_differences({"args": now, "hparams": hparams}, dict(now, **{key: value}),
                                      hparams) == [
            f"--{key}: {default!r} in the checkpoint (the default), {value!r} now"]
    old = {"args": dict(now, alignment_scores="a.csv"), "hparams": hparams}
    assert checkpoint_differences(old, now, hparams) == [
        "--alignment_scores: 'a.csv' in the checkpoint, not given now"]


def test_resume_in_a_moved_folder_is_allowed(tmp_path, stopped_job, uninterrupted_run):
    first, moved = tmp_path / "first", tmp_path / "moved"
    copy_of_stopped(stopped_job, first)
    first.rename(moved)
    assert train.run(args_for(moved, *REFERENCE_STEPS, "--resume")) == "done"
    assert comparable(read_records(moved)) == comparable(uninterrupted_run)


#: The base hparams added by the release that brought batch sampling and lr schedules.
NEW_BASE_HPARAMS = ("batch_sampling", "lr_schedule", "lr_decay", "lr_inv_gamma", "lr_inv_power")


def strip_hparams(path, names):
    """Rewrite the checkpoint ``path`` as a release before ``names`` existed wrote it."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    for name in names:
        del state["hparams"][name]
    torch.save(state, path)


def test_resume_of_a_checkpoint_written_before_new_hparams_existed(tmp_path, capsys,
                                                                   stopped_job):
    """A job interrupted before the upgrade: its checkpoint lacks the new base hparams. Left at
    their defaults (what that release did) they are no difference and --resume continues; a
    non-default value of a missing hparam is still refused, and nothing is changed."""
    out = tmp_path / "job"
    base = ["--dataset", "Debug28", "--output_dir", str(out), "--steps", "5",
            "--checkpoint_freq", "2"]
    copy_of_stopped(stopped_job, out)
    strip_hparams(out / "checkpoint.pt", NEW_BASE_HPARAMS)
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.name not in ("out.txt", "err.txt")}
    scheduled = '{"batch_size": 8, "lr_schedule": "exp_epoch"}'
    assert main(base + ["--hparams", scheduled, "--resume"]) == 2
    console = "".join(capsys.readouterr())
    listed = console.split("--resume with other arguments")[1].split("Rerun with")[0]
    assert [line.strip() for line in listed.splitlines() if "hparam " in line] == [
        "hparam lr_schedule: None in the checkpoint, 'exp_epoch' now"]  # the defaults: unchanged
    assert {p.name: p.read_bytes() for p in out.iterdir()
            if p.name not in ("out.txt", "err.txt")} == kept
    assert main(base + ["--hparams", TINY, "--resume"]) == 0
    assert "Resuming from step 3" in "".join(capsys.readouterr())
    assert [r["step"] for r in read_records(out)] == [0, 2, 4]


def test_checkpoint_differences_take_a_missing_hparam_at_its_default_as_unchanged():
    """The rule behind the resume across the upgrade, for a dataset's hparams (PACS's
    augmentation and data_split) and an algorithm's own (DMG's) as well: the defaults are those
    of the job's algorithm and dataset."""
    from dg_plugins import hparams as hparams_lib
    from dg_plugins.train.checkpoint import checkpoint_differences

    record_args = {"algorithm": "DMG", "dataset": "PACS", "seed": 0}
    now = hparams_lib.default_hparams("DMG", "PACS")
    added = ("augmentation", "data_split", "dmg_mask_lr_schedule", "dmg_fc_init_std",
             *NEW_BASE_HPARAMS)
    assert set(added) <= set(now)
    old = {"args": dict(record_args), "hparams": {k: v for k, v in now.items() if k not in added}}
    assert checkpoint_differences(old, record_args, now) == []
    changed = dict(now, augmentation="dmg_pacs", batch_sampling="pooled")
    assert checkpoint_differences(old, record_args, changed) == [
        "hparam augmentation: None in the checkpoint, 'dmg_pacs' now",
        "hparam batch_sampling: None in the checkpoint, 'pooled' now"]
    # a key the checkpoint has is compared as before, default or not
    assert checkpoint_differences({"args": record_args, "hparams": dict(now, lr_decay=0.9)},
                                  record_args, now) == [
        "hparam lr_decay: 0.9 in the checkpoint, 0.99 now"]
    # a key dropped since the checkpoint was written is still a difference
    assert checkpoint_differences({"args": record_args, "hparams": dict(now, gone=1)},
                                  record_args, now) == ["hparam gone: 1 in the checkpoint, None now"]


# --resume refuses records that do not match the checkpoint ---------------------------------------

def test_resume_refuses_when_a_counted_record_is_missing(tmp_path, capsys, stopped_job):
    out = copy_of_stopped(stopped_job, tmp_path / "job")
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:-1]))  # the OS lost the last record
    assert main(REFERENCE_RUN + ["--output_dir", str(out), "--resume"]) == 2
    assert "holds 1 complete records but the checkpoint counts 2" in "".join(capsys.readouterr())


def test_resume_drops_a_torn_line_after_the_counted_records(tmp_path, stopped_job,
                                                            uninterrupted_run):
    out = copy_of_stopped(stopped_job, tmp_path / "job")
    with open(out / "results.jsonl", "a") as f:
        f.write('{"step": 4, "env0_in_acc": 0.')  # a crash mid-append
    assert train.run(args_for(out, *REFERENCE_STEPS, "--resume")) == "done"
    assert comparable(read_records(out)) == comparable(uninterrupted_run)


def test_each_record_is_synced_before_the_checkpoint_that_counts_it(tmp_path, monkeypatch):
    """A checkpoint counts only records already on disk; the last step's record is followed by
    model.pkl and done, not by a checkpoint (the job is over)."""
    events = []
    from dg_plugins.train import checkpoint

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
    assert order == ["record", "checkpoint"] * 2 + ["record"]
    assert (tmp_path / "done").exists() and not (tmp_path / "checkpoint.pt").exists()


# SIGTERM stops at a step boundary; --resume continues; one process per job folder --------------

def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint_and_resume_continues(
        tmp_path, capsys, uninterrupted_run):
    """A real SIGTERM to the train command (held by the test's gate after step 3, between two
    records): it stops at that step boundary with a checkpoint and exits 143; --resume then
    writes the records of an uninterrupted run. While it is held, a second train (here in the
    test's own process) tries the same folder and fails; the first is unharmed by it: it stops
    as above, releases its folder, and its files resume to the uninterrupted run's records."""
    out, gate = tmp_path / "job", tmp_path / "gate"
    gate.mkdir()
    proc = spawn(out, steps=REFERENCE_STEPS[1], freq=REFERENCE_STEPS[3],
                 gate={"folder": gate, "step": 3})
    with released(gate):
        assert wait_for(lambda: (gate / "waiting").exists())
        assert main(REFERENCE_RUN + ["--output_dir", str(out), "--resume"]) == 2
        assert "is in use by another train process (pid" in capsys.readouterr().err
        proc.send_signal(signal.SIGTERM)
        console = "".join(proc.communicate(timeout=120))
    assert proc.returncode == 143, console
    assert "stopped by SIGTERM" in console and "--resume" in console
    assert "stopped by SIGTERM after step 3" in (out / "err.txt").read_text()
    assert (out / "checkpoint.pt").exists() and not (out / "done").exists()
    assert not (out / ".lock").exists()
    assert main(REFERENCE_RUN + ["--output_dir", str(out), "--resume"]) == 0
    assert comparable(read_records(out)) == comparable(uninterrupted_run)


@pytest.fixture(autouse=True, scope="module")
def _test_plugins():
    from support import big_state_algorithm  # noqa: F401  (registers CrashingData)

    yield


# issue 31: repeated test environments, unwritable folders, stale logs ----------------------------

def test_repeated_test_environments_are_rejected_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--test_envs", "0", "0"]) == 2
    assert "--test_envs 0 0 names environment(s) [0] more than once" in capsys.readouterr().err
    assert not out.exists()


def test_an_unwritable_output_folder_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """The folder cannot be created (e.g. a read-only parent) or its lock file cannot be written:
    one line naming the folder and the fix, exit 2, no traceback (simulated: the tests may run as
    root, who may write anywhere; the next test does it for real when they do not)."""
    import errno

    out = tmp_path / "readonly" / "job"
    real_makedirs, real_open = os.makedirs, os.open

    def makedirs(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "readonly")):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "readonly"))
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    assert main(["--dataset", "Debug28", "--output_dir", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write to the output folder ") and str(out) in err
    assert "choose a writable --output_dir" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setattr(os, "makedirs", real_makedirs)

    def read_only_open(path, flags, *args):
        if str(path).startswith(str(tmp_path / "existing")) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_open(path, flags, *args)

    (tmp_path / "existing").mkdir()
    monkeypatch.setattr(os, "open", read_only_open)
    assert main(["--dataset", "Debug28", "--output_dir", str(tmp_path / "existing"),
                 "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write to the output folder {tmp_path / 'existing'} (Read-only file system" \
        in err and "Traceback" not in err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root may write into a read-only folder")
def test_a_read_only_output_folder_is_a_one_line_error_for_train_and_sweep(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        proc = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.train", "--dataset",
                               "Debug28", "--steps", "2", "--output_dir", str(parent / "job")],
                              capture_output=True, text=True, env=child_env(), timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"cannot write to the output folder {parent}" in proc.stderr
        proc = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.sweep", "launch",
                               "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", "x",
                               "--output_dir", str(parent / "sweep"), "--n_hparams", "1",
                               "--n_trials", "1", "--command_launcher", "local",
                               "--skip_confirmation"],
                              capture_output=True, text=True, env=child_env(), timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"error: cannot write to the output folder {parent}" in proc.stderr
    finally:
        parent.chmod(0o755)


# issue 31: a damaged checkpoint, a full disk -----------------------------------------------------

def test_a_damaged_checkpoint_on_resume_is_a_one_line_error_and_force_recovers(tmp_path, capsys,
                                                                               stopped_job):
    out = tmp_path / "job"
    base = REFERENCE_RUN + ["--output_dir", str(out)]
    copy_of_stopped(stopped_job, out)
    data = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(data[:len(data) // 2])  # e.g. a copy cut short
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.name not in ("out.txt", "err.txt")}
    assert main(base + ["--resume"]) == 2
    console = "".join(capsys.readouterr())
    assert f"{out / 'checkpoint.pt'} is damaged and cannot be resumed from" in console
    assert "--force" in console and "Traceback" not in console
    assert {p.name: p.read_bytes() for p in out.iterdir()
            if p.name not in ("out.txt", "err.txt")} == kept  # nothing changed
    assert main(base + ["--force"]) == 0
    assert [r["step"] for r in read_records(out)] == [0, 2, 4]


def test_a_checkpoint_that_does_not_unpickle_is_a_one_line_error_and_force_recovers(tmp_path,
                                                                                    capsys,
                                                                                    stopped_job):
    """A checkpoint that is an intact archive (every CRC matches) but does not unpickle, e.g.
    written by an incompatible version whose classes are gone: the one-line damaged-checkpoint
    error with --force, no traceback, nothing changed."""
    import zipfile

    from dg_plugins.train.checkpoint import checkpoint_damage

    out = tmp_path / "job"
    base = REFERENCE_RUN + ["--output_dir", str(out)]
    copy_of_stopped(stopped_job, out)
    path = out / "checkpoint.pt"
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:  # the same archive, another pickle
        for info, data in members:
            if info.filename.endswith("/data.pkl"):  # an instance of a class that is gone
                data = b"\x80\x02cdg_plugins_old_release.state\nCheckpoint\n)\x81q\x00."
            archive.writestr(info, data)
    assert checkpoint_damage(str(path)) is None  # the archive itself is intact
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.name not in ("out.txt", "err.txt")}
    assert main(base + ["--resume"]) == 2
    console = "".join(capsys.readouterr())
    assert f"{path} is damaged and cannot be resumed from: it cannot be unpickled" in console
    assert "dg_plugins_old_release" in console
    assert "--force" in console and "Traceback" not in console
    assert {p.name: p.read_bytes() for p in out.iterdir()
            if p.name not in ("out.txt", "err.txt")} == kept
    assert main(base + ["--force"]) == 0
    assert [r["step"] for r in read_records(out)] == [0, 2, 4]


def test_a_checkpoint_that_does_not_fit_the_model_is_a_one_line_error(tmp_path, capsys,
                                                                      stopped_job):
    """Same arguments, but a model state another version of the algorithm wrote (a parameter it
    did not have): one line naming the file and the fix, no traceback, the records kept."""
    import torch

    out = tmp_path / "job"
    base = REFERENCE_RUN + ["--output_dir", str(out)]
    copy_of_stopped(stopped_job, out)
    state = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    state["model"]["head_of_another_version.weight"] = torch.zeros(2)
    torch.save(state, out / "checkpoint.pt")
    kept = (out / "results.jsonl").read_bytes()
    assert main(base + ["--resume"]) == 2
    console = "".join(capsys.readouterr())
    assert (f"{out / 'checkpoint.pt'} does not fit this job's model and cannot be resumed from"
            in console and "head_of_another_version" in console)
    assert "--force" in console and "Traceback" not in console
    assert (out / "results.jsonl").read_bytes() == kept


def test_resume_loads_the_checkpoint_once(tmp_path, monkeypatch, stopped_job):
    import torch

    out = copy_of_stopped(stopped_job, tmp_path / "job")
    loads, real_load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    assert train.run(args_for(out, "--steps", "5", "--checkpoint_freq", "2", "--resume")) == "done"
    assert [str(p) for p in loads] == [str(out / "checkpoint.pt")]


@pytest.mark.parametrize("target, failing_write", [
    ("checkpoint.pt", 2),  # the checkpoint after the second record
    ("results.jsonl", 2),  # the second record
    ("model.pkl", 1),      # the model of the finished job
])
def test_a_full_disk_is_a_one_line_error_and_resume_continues(tmp_path, capsys, monkeypatch,
                                                              uninterrupted_run, target,
                                                              failing_write):
    """ENOSPC while writing a checkpoint, a record or the model: one line (free space, then
    --resume), exit 1; no temporary file or torn record is left, the last checkpoint stays
    valid, and --resume then writes the records of an uninterrupted run."""
    import errno

    from dg_plugins.train.checkpoint import checkpoint_damage

    out, base = tmp_path / "job", REFERENCE_RUN
    real_fsync, writes = os.fsync, []

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(target) and str(out) in path:
            writes.append(path)
            if len(writes) == failing_write:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(base + ["--output_dir", str(out)]) == 1
    console = "".join(capsys.readouterr())
    assert "error: no space left on the device of" in console and "Traceback" not in console
    assert f"while writing {out / target}" in console and "--resume" in console
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not list(out.glob(".tmp-*")) and not (out / "done").exists()
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)  # no torn record
    assert checkpoint_damage(str(out / "checkpoint.pt")) is None
    assert "no space left" in (out / "err.txt").read_text()
    assert main(base + ["--output_dir", str(out), "--resume"]) == 0
    assert comparable(read_records(out)) == comparable(uninterrupted_run)


# issue 31: SIGTERM while a UDG job waits for another job's pretraining ---------------------------

HOLD_LOCK = """
import fcntl, os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
open(os.path.join(sys.argv[1], "..", "holding"), "w").close()
time.sleep(120)
"""


def test_sigterm_while_waiting_for_a_pretraining_says_what_happened(tmp_path):
    """A UDG job waiting for the pretraining another job holds is stopped by SIGTERM: it says it
    stopped while waiting (not "after step -1; a checkpoint was written"), exits 143, and the
    same command afterwards runs to the end."""
    from dg_plugins.train import udg as udg_jobs

    out = tmp_path / "sweep" / "job"
    argv = ["--dataset", "Debug28", "--algorithm", "MAE", "--label_fraction", "0.5",
            "--pretrain_steps", "2", "--steps", "2", "--hparams",
            '{"batch_size": 4, "vit_arch": "tiny"}', "--output_dir", str(out)]
    args = build_parser().parse_args(argv)
    from dg_plugins import hparams as hparams_lib
    hp = hparams_lib.job_hparams("MAE", "Debug28", 0, 0, args.hparams)
    folder = Path(udg_jobs.pretrain_root(args)) / udg_jobs.pretrain_key(
        udg_jobs.pretrain_identity(args, hp, 2))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)])
    try:
        assert wait_for(lambda: (folder.parent / "holding").exists(), timeout=60)
        proc = subprocess.Popen([sys.executable, "-m", "dg_plugins.scripts.train", *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=child_env())
        assert wait_for(lambda: (out / "err.txt").exists()
                        and "waiting for it" in (out / "err.txt").read_text(), timeout=300)
        proc.send_signal(signal.SIGTERM)
        console = proc.communicate(timeout=120)[0]
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 143, console
    message = f"stopped by SIGTERM while waiting for the UDG pretraining in {folder}"
    assert message in console and message in (out / "err.txt").read_text()
    assert "after step -1" not in console and "checkpoint was written" not in console
    assert "Traceback" not in console
    assert main(argv) == 0
    assert (out / "done").exists() and (folder / "done").exists()


# issue 58: bad input the job used to meet only after its folder existed, or at step 1 ------------

def train_command(tmp_path, *args, env=None):
    """The train command as users run it (a subprocess)."""
    return subprocess.run([sys.executable, "-m", "dg_plugins.scripts.train", *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.fixture
def tiny_pacs(tmp_path):
    from support.image_tree import make_pacs_tree

    return make_pacs_tree(tmp_path / "data", per_class=1, size=32)


@pytest.mark.parametrize("case", ["n_workers", "data_dir_file", "image_size"])
def test_bad_input_is_one_line_and_leaves_no_job_folder(tmp_path, capsys, tiny_pacs, case):
    """--n_workers -1, a --data_dir that is a file and an image_size too large for memory (it
    failed at step 1 with a MemoryError) are refused in one line, exit 2, before the job folder
    is made. (In-process: the messages are the subject; the kornia test below checks one such
    line from the real command.)"""
    out = tmp_path / "job"
    image = sorted(tiny_pacs.rglob("*.jpg"))[0]
    argv, message = {
        "n_workers": (["--dataset", "Debug28", "--n_workers", "-1"],
                      "error: --n_workers must be >= 0, got -1"),
        "data_dir_file": (["--dataset", "RotatedMNIST", "--data_dir", str(image)],
                          f"error: --data_dir {image} is a file, not a folder"),
        "image_size": (["--dataset", "ImageFolder", "--data_dir", str(tiny_pacs / "PACS"),
                        "--hparams", '{"image_size": 10000}'],
                       "error: hparam 'image_size' must be a multiple of 16 from 32 to 1024"),
    }[case]
    assert main([*argv, "--steps", "1", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), err[-3000:]
    assert not out.exists()


def test_a_kornia_without_enhance_is_named_before_the_job_starts(tmp_path, tiny_pacs):
    """A kornia that imports but lacks what --augment_on device calls (an old one, or another
    package of that name) used to fail at step 1 with an AttributeError traceback."""
    fake = tmp_path / "fake" / "kornia"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.5.0"\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "job"
    done = train_command(tmp_path, "--dataset", "PACS", "--data_dir", str(tiny_pacs),
                         "--augment_on", "device", "--device", "cpu", "--steps", "1",
                         "--hparams", '{"image_size": 32}', "--output_dir", str(out), env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert "kornia.enhance.adjust_brightness_accumulative" in lines[0]
    assert "(0.5.0, " in lines[0] and "pip install 'kornia>=0.7'" in lines[0]
    assert not out.exists()
