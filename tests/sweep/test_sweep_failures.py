"""What a user meets when a sweep goes wrong, run as the user runs it (``python -m
dg_plugins.scripts.sweep`` with the local launcher, under a timeout): problems every job would meet
are found once before launching; failed jobs make the sweep fail with a summary; a killed sweep
takes its jobs down and a relaunch continues them; a still-running job is left alone; a script
without a ``__main__`` guard can drive the sweep."""

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dg_plugins import catalog
from dg_plugins.sweep import checks, jobs
from dg_plugins.job.folder import lock_holder
from support.helpers import read_records
from support.image_tree import make_pacs_tree, truncate_image
from support.job_gate import gate_env, released
from support.processes import command_env, finish, run, start, survivors

SWEEP = "dg_plugins.scripts.sweep"


def sweep_argv(out, *extra, launcher="local", data_dir="builtin", datasets=("RotatedMNIST5k",)):
    return ["launch", "--datasets", *datasets, "--data_dir", str(data_dir), "--output_dir",
            str(out), "--n_hparams", "1", "--n_trials", "1", "--command_launcher", launcher,
            "--skip_confirmation", *extra]


def wait_for(predicate, timeout=120.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def job_folders(out) -> list[Path]:
    """The job folders (not the live launchers' claims, .launchers)."""
    return sorted(p for p in Path(out).iterdir() if p.is_dir() and not p.name.startswith(".")
                  ) if Path(out).is_dir() else []


# ---------------------------------------------------------------------------------------------
# Problems every job would meet are found once, before launching


def test_missing_data_and_weights_are_found_before_launching(tmp_path, capsys):
    """PACS without its folder, and offline with empty caches: the sweep names both problems
    (with their fixes), launches nothing and exits 2 (the real command); --steps 0 likewise.
    With the data in place and random-init weights, the same sweep launches (these two in
    process: the refusal of a flag and a dummy launch)."""
    from dg_plugins.sweep import cli as sweep_cli

    env = command_env(HF_HOME=str(tmp_path / "hf"), TORCH_HOME=str(tmp_path / "torch"),
                      HF_HUB_OFFLINE="1")
    out = tmp_path / "out"
    data = tmp_path / "data"
    argv = sweep_argv(out, "--algorithms", "ERM", "--single_test_envs", "--steps", "5",
                      launcher="dummy", data_dir=data, datasets=("PACS",))
    code, text = run(SWEEP, *argv, env=env, timeout=180)
    assert code == 2, text
    assert f"error: PACS: dataset folder {data / 'PACS'} does not exist" in text
    assert (f"On a machine with internet, `python -m dg_plugins.scripts.download --data_dir "
            f"{data} PACS` downloads it.") in text
    assert "error: ERM on PACS: pretrained weights for timm resnet50.ram_in1k are not cached" \
        in text and "offline mode is set" in text and '{"pretrained": false}' in text
    assert "Nothing was launched (2 problem(s) above" in text
    assert "Traceback" not in text and "Dummy launcher" not in text and not out.exists()

    with pytest.raises(SystemExit) as exited:  # --steps 0
        sweep_cli.main([*argv[:-1], "0"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert "--steps must be a positive integer, got 0" in captured.err, captured
    assert not out.exists()

    make_pacs_tree(data, per_class=1, size=16)
    assert sweep_cli.main([*argv, "--hparams", '{"pretrained": false}']) == 0
    captured = capsys.readouterr()
    assert captured.out.count("Dummy launcher: ") == 4, captured
    assert "error:" not in captured.out + captured.err


def test_data_checks_use_each_datasets_own_lookup(tmp_path):
    """The sweep asks each dataset class (its check_data_dir): MNIST's four files and each Digits
    domain are looked for where the datasets look, with their own messages (the downloader's
    command where it provides the files), reading nothing; datasets that read no files are not
    checked."""
    from dg_plugins.datasets import mnist

    with pytest.raises(FileNotFoundError, match="MNIST files not found") as err:
        checks.check_data("RotatedMNIST", str(tmp_path))
    assert f"python -m dg_plugins.scripts.download --data_dir {tmp_path} MNIST" in str(err.value)
    with pytest.raises(FileNotFoundError, match="Digits domain 'mnist' not found") as err:
        checks.check_data("Digits", str(tmp_path))
    assert "does not provide Digits" in str(err.value) and "never downloads" not in str(err.value)
    assert "Also missing: 'svhn', 'mnist_m', 'syn', 'usps'" in str(err.value)
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    for name in mnist.MNIST_FILES.values():
        (tmp_path / "MNIST" / "raw" / (name + ".gz")).write_bytes(b"")  # not read
    (tmp_path / "digits").mkdir()
    for domain in ("mnist", "svhn", "mnist_m", "syn"):
        (tmp_path / "digits" / f"{domain}.npz").write_bytes(b"")
    checks.check_data("ColoredMNIST", str(tmp_path))
    (tmp_path / "digits" / "usps" / "3").mkdir(parents=True)  # a digit folder without images
    with pytest.raises(FileNotFoundError, match="Digits domain 'usps' not found"):
        checks.check_data("Digits", str(tmp_path))
    (tmp_path / "digits" / "usps" / "3" / "a.png").write_bytes(b"")
    checks.check_data("Digits", str(tmp_path))
    checks.check_data("RotatedMNIST5k", str(tmp_path / "nowhere"))


def test_image_folder_check_gives_the_download_command_only_where_it_helps(tmp_path):
    """A missing dataset folder gets the downloader's command (DomainNet20's is DomainNet's); an
    existing but incomplete one (which the downloader leaves alone) and the generic ImageFolder
    (which it does not provide) do not."""
    data = tmp_path / "data"
    with pytest.raises(FileNotFoundError) as err:
        checks.check_data("DomainNet20", str(data))
    assert ("does not exist" in str(err.value) and f"`python -m dg_plugins.scripts.download "
            f"--data_dir {data} DomainNet` downloads it." in str(err.value))
    with pytest.raises(FileNotFoundError, match="pass --data_dir.*--data_dir <data_dir> VLCS"):
        checks.check_data("VLCS", None)
    (data / "VLCS").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no domain folders") as err:
        checks.check_data("VLCS", str(data))
    assert "dg_plugins.scripts.download" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="does not exist") as err:
        checks.check_data("ImageFolder", str(tmp_path / "nowhere"))
    assert "dg_plugins.scripts.download" not in str(err.value)


def test_weights_check_finds_a_missing_pretrained_path_and_loads_nothing(tmp_path):
    """The weights check builds each configuration up to its first weight request: a missing
    ``pretrained_path`` is named; an existing one is accepted without being read (it is not a
    checkpoint at all here); small-image datasets are not probed."""
    def jobs_of(dataset, hparams):
        args = jobs.make_args_list(1, [dataset], ["ERM"], 0, 1, 3, str(tmp_path),
                                   "domain_generalization", 0.2, True, hparams)
        return jobs.make_jobs(args, str(tmp_path / "out"))

    missing = '{"pretrained_path": "%s"}' % (tmp_path / "missing.pth")
    [problem] = checks.weight_problems(jobs_of("PACS", missing))
    assert problem.startswith("ERM on PACS: pretrained_path ") and "does not exist" in problem
    (tmp_path / "present.pth").write_text("not read by the check")
    assert checks.weight_problems(jobs_of("PACS", missing.replace("missing", "present"))) == []
    assert checks.weight_problems(jobs_of("RotatedMNIST5k", None)) == []


@pytest.mark.parametrize("name", catalog.BUILTIN_ALGORITHMS)
def test_no_builtin_algorithm_asks_for_weights_with_pretrained_false(name):
    """What lets the weights check skip our algorithms' jobs with ``"pretrained": false``
    (``checks._may_load_weights``): built with it, on every default backbone of PACS-sized
    images (ResNet-50, ResNet-18, the ResNet-50 AugMix, a ViT) and with a ``pretrained_path``,
    none of them asks for weights."""
    import torch

    import dg_plugins.algorithms  # noqa: F401  (registers them)
    from dg_plugins import hparams as hparams_lib
    from dg_plugins.networks.pretrained import probing
    from dg_plugins.registry import ALGORITHMS

    for backbone in ({}, {"resnet18": True}, {"resnet18": False, "resnet50_augmix": True},
                     {"vit": True}, {"pretrained_path": "/no/such/file.pth"}):
        hp = hparams_lib.default_hparams(name, "PACS")
        hp.update(backbone, pretrained=False)
        with probing(), torch.device("meta"):
            ALGORITHMS.get(name)((3, 224, 224), 7, 3, hp)  # a request would raise


def score_file(path, scores=(0.3, 0.5), **meta):
    """A small score file (two PACS images) whose header says which CLIP model scored it."""
    import pandas as pd

    from dg_plugins.alignment import write_scores

    frame = pd.DataFrame({"env": [0, 0], "env_name": ["art_painting"] * 2,
                          "path": ["PACS/art_painting/dog/a.jpg", "PACS/art_painting/dog/b.jpg"],
                          "label": [0, 0], "class": ["dog"] * 2, "score": list(scores)})
    write_scores(str(path), frame, meta)
    return str(path)


@pytest.mark.parametrize("extra, problem", [
    ([], "is not a score file: it holds binary data"),
    (["--scores", "0.3", "1.5"], "1 scores lie outside [-1, 1] (line 5: 1.5)"),
    (["--alignment_model", "ViT-L-14"], "does not fit the expected model (--alignment_model / "
     "--alignment_pretrained), which needs scores of ViT-L-14: it was scored by ViT-B-16"),
    (["--alignment_preset", "teterwak2025", "--alignment_threshold", "0.3"],
     "alignment preset 'teterwak2025' sets its own threshold"),
])
def test_a_score_file_every_job_would_refuse_is_refused_once_before_launching(
        tmp_path, capsys, extra, problem):
    """The --alignment_scores file is read once before launching: a binary file, scores out of
    [-1, 1], another CLIP model than --alignment_model, a rule that cannot be: one error line
    for the whole sweep (not one failed job each), nothing launched."""
    from dg_plugins.sweep import cli as sweep_cli

    if not extra:
        scores = tmp_path / "scores.npz"
        scores.write_bytes(b"PK\x03\x04\x00\x00binary")
    elif extra[0] == "--scores":
        scores = score_file(tmp_path / "scores.csv", [float(v) for v in extra[1:]],
                            model="ViT-B-16")
        extra = []
    else:
        scores = score_file(tmp_path / "scores.csv", model="ViT-B-16",
                            pretrained="laion400m_e32")
    out = tmp_path / "out"
    argv = sweep_argv(out, "--algorithms", "ERM", "--alignment_scores", str(scores), *extra,
                      launcher="dummy", datasets=("Debug28",))
    assert sweep_cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out.count("Not launched") >= 3  # several jobs ...
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and problem in errors[0], captured.err  # ... one line
    assert "Dummy launcher" not in captured.out and not out.exists()


def test_the_expected_clip_model_reaches_every_job_and_its_identity_only_when_given(tmp_path,
                                                                                   capsys):
    from dg_plugins.sweep import cli as sweep_cli

    scores = score_file(tmp_path / "scores.csv", model="ViT-B-16", pretrained="laion400m_e32")
    base = ["--algorithms", "ERM", "--alignment_scores", scores]
    expected = ["--alignment_model", "ViT-B-16", "--alignment_pretrained", "laion400m_e32"]
    assert sweep_cli.main(sweep_argv(tmp_path / "out", *base, *expected, launcher="dummy",
                                     datasets=("Debug28",))) == 0
    commands = [l for l in capsys.readouterr().out.splitlines() if l.startswith("Dummy")]
    assert len(commands) >= 3 and all(
        "--alignment_model ViT-B-16 --alignment_pretrained laion400m_e32" in c for c in commands)

    def identities(*flags):
        args = jobs.make_args_list(1, ["Debug28"], ["ERM"], 0, 1, None, "d",
                                    "domain_generalization", 0.2, True, None,
                                    extra_args=dict(zip(flags[::2], flags[1::2])))
        return [jobs.job_folder_name(a) for a in args]

    plain = identities("alignment_scores", scores)
    given = identities("alignment_scores", scores, "alignment_model", "ViT-B-16")
    assert given != plain and len(set(given) | set(plain)) == 2 * len(plain)
    assert all("alignment_model" not in a for a in jobs.make_args_list(
        1, ["Debug28"], ["ERM"], 0, 1, None, "d", "domain_generalization", 0.2, True, None,
        extra_args={"alignment_scores": scores}))


def test_jobs_that_fail_make_the_sweep_fail_with_a_summary(tmp_path, capfd, monkeypatch):
    """Two jobs that crash (a dataset whose items raise): every job runs, then the sweep lists
    each failure with its error line and err.txt, says how to continue, and exits 1 (it used to
    print "Launched 2 jobs!" and exit 0). (The sweep's ``main`` in process, its local launcher
    forking the jobs, which load the dataset's plugin module as the sweep does.)"""
    from dg_plugins.sweep import cli as sweep_cli

    monkeypatch.setenv("DG_PLUGINS_IMPORT", "support.big_state_algorithm")  # tests/ is on sys.path
    out = tmp_path / "out"
    argv = sweep_argv(out, "--algorithms", "ERM", "--test_env_sets", "0", "1", "--steps", "3",
                      "--hparams", '{"batch_size": 4}', datasets=("CrashingData",))
    code = sweep_cli.main(argv)
    text = capfd.readouterr().out
    assert code == 1, text
    folders = job_folders(out)
    assert len(folders) == 2
    assert "local launcher: 2 of 2 commands failed:" in text
    # one line per job on the terminal (its settings and traceback are in its out.txt/err.txt)
    assert len(re.findall(r"\] started: ERM on CrashingData, test envs [01], hparams 0, trial 0 "
                          r"\(log: .*/out.txt\)\n", text)) == 2
    assert len(re.findall(r"\] failed \(exit code 1\) in \d+ s: RuntimeError: decoder exploded "
                          "on item", text)) == 2
    assert "HParams:" not in text and "Traceback" not in text
    assert text.count("RuntimeError: decoder exploded on item") >= 2
    for folder in folders:
        assert f"log: {folder / 'err.txt'}" in text
        assert not (folder / "done").exists()
    assert "Sweep: 2 of 2 launched jobs failed" in text and "Launched" not in text
    assert f"-m dg_plugins.scripts.sweep {' '.join(argv)} --resume" in text.replace("'", "")


# ---------------------------------------------------------------------------------------------
# A killed sweep, a running job, a relaunch


def test_kill_9_of_the_sweep_stops_its_job_and_a_relaunch_resumes_it(tmp_path, capfd):
    """kill -9 of a local-launcher sweep while its job trains (held after step 4 by the test's
    gate until it stops): the job gets SIGTERM from the kernel, stops at a checkpoint and exits
    (it used to train on, holding its lock); then ``sweep launch --resume`` continues it to the
    end, with the records of an uninterrupted run's steps, and no process is left behind."""
    gate = tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=4)
    out = tmp_path / "out"
    argv = sweep_argv(out, "--algorithms", "ERM", "--test_env_sets", "2", "--steps", "8",
                      "--checkpoint_freq", "3", "--hparams", '{"batch_size": 8}',
                      datasets=("Debug28",))
    proc = start(SWEEP, *argv, env=env)
    with released(gate):
        pid = wait_for(lambda: (gate / "waiting").exists() and (gate / "waiting").read_text())
        [job] = job_folders(out)
        assert lock_holder(str(job)) == pid
        os.kill(proc.pid, signal.SIGKILL)
        wait_for(lambda: not alive(int(pid)), timeout=60)  # the job followed its launcher
        finish(proc, timeout=30)
    assert lock_holder(str(job)) is None and not (job / "done").exists()
    assert "stopped: stopped by SIGTERM after step 4" in (job / "err.txt").read_text()

    assert survivors(env) == []  # the killed sweep's fork server and job

    from dg_plugins.sweep import cli as sweep_cli  # the relaunch: its main in process

    assert sweep_cli.main([*argv, "--resume"]) == 0
    text = capfd.readouterr().out
    assert "(1 of them are Incomplete and will run with --resume.)" in text, text
    assert (job / "done").exists()
    assert [r["step"] for r in read_records(job)] == [0, 3, 6, 7]


HOLD_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    open(os.path.join(sys.argv[1], "holding"), "w").close()
    time.sleep(120)
""")


def test_a_running_job_is_left_alone_and_reported_as_running(tmp_path, capsys):
    """A job whose folder lock a live process holds: ``launch --resume`` neither relaunches nor
    calls it failed (it says it is running, with the pid), ``delete_incomplete`` keeps its
    folder; once the process is gone the job is Incomplete again. (The sweeps run in process,
    with the dummy launcher: the lock's holder is the other process.)"""
    from dg_plugins.sweep import cli as sweep_cli

    out = tmp_path / "out"
    argv = sweep_argv(out, "--algorithms", "ERM", "--test_env_sets", "5", "--steps", "3",
                      launcher="dummy")
    [job_args] = jobs.make_args_list(1, ["RotatedMNIST5k"], ["ERM"], 0, 1, 3, "builtin",
                                      "domain_generalization", 0.2, False, None,
                                      test_env_sets=[[5]])
    job = out / jobs.job_folder_name(job_args)
    job.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(job)])
    try:
        wait_for(lambda: (job / "holding").exists(), timeout=30)
        assert sweep_cli.main([*argv, "--resume"]) == 0
        text = capsys.readouterr().out
        assert "1 jobs: 0 done, 0 incomplete, 1 running, 0 not launched." in text, text
        assert f"running (pid {holder.pid}): {job}" in text
        assert "About to launch 0 jobs." in text and "Dummy launcher" not in text
        assert sweep_cli.main(["delete_incomplete", *argv[1:]]) == 0
        assert job.is_dir(), capsys.readouterr()
    finally:
        holder.kill()
        holder.wait()
    capsys.readouterr()
    assert sweep_cli.main([*argv, "--resume"]) == 0
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if line.startswith("Dummy launcher: ")
            and line.endswith(f"--output_dir {job} --seed {job_args['seed']} --steps 3 --task "
                              "domain_generalization --test_envs 5 --trial_seed 0 --resume")], text


# ---------------------------------------------------------------------------------------------
# Names and environments found by the sweep


def test_image_folder_sweep_finds_its_environments_and_names_are_checked(tmp_path, capsys):
    """``--datasets ImageFolder --data_dir D`` enumerates D's domain folders (it ended in a
    traceback); a missing D and unknown names are one-line errors, exit 2, as train's (the
    sweep's ``main`` in process: a traceback would be an exception here)."""
    from dg_plugins.sweep import cli as sweep_cli

    data = make_pacs_tree(tmp_path / "data", per_class=1, size=16) / "PACS"
    out = tmp_path / "out"
    assert sweep_cli.main(sweep_argv(out, "--algorithms", "ERM", "--single_test_envs",
                                     "--dry_run", data_dir=data, datasets=("ImageFolder",))) == 0
    text = capsys.readouterr().out
    assert "4 jobs: 0 done, 0 incomplete, 4 not launched." in text, text
    for argv, message in [
            (sweep_argv(out, "--algorithms", "ERM", data_dir=tmp_path / "nowhere",
                        datasets=("ImageFolder",)), "does not exist"),
            (sweep_argv(out, "--algorithms", "ERM", datasets=("PAC",)),
             "unknown dataset 'PAC'; did you mean 'PACS'"),
            (sweep_argv(out, "--algorithms", "ERM", datasets=("pacs",)),
             "unknown dataset 'pacs'; did you mean 'PACS'"),
            (sweep_argv(out, "--algorithms", "dmg", "ERMM"),
             "unknown algorithm 'ERMM' (did you mean 'ERM'"),
            (sweep_argv(out, "--algorithms", "ERM", datasets=("SVIRO",)),
             "SVIRO is a DomainBed dataset that dg_plugins does not implement; run it through "
             "the bridge")]:
        with pytest.raises(SystemExit) as exited:
            sweep_cli.main(argv)
        captured = capsys.readouterr()
        text = captured.out + captured.err
        assert exited.value.code == 2 and message in text and "Traceback" not in text, text
        assert len([line for line in captured.err.splitlines() if "error:" in line]) == 1, text
    assert not out.exists()


GUARDLESS_SCRIPT = textwrap.dedent("""
    # A user's script driving the sweep, without an `if __name__ == "__main__":` guard.
    import sys
    from dg_plugins.scripts import sweep
    with open(sys.argv[1], "a") as f:
        f.write("ran\\n")
    code = sweep.main(sys.argv[2:])
    print("sweep exit status", code)
    sys.exit(code)
""")


@pytest.fixture(scope="module")
def image_folder_sweep(tmp_path_factory):
    """One real sweep, started as a user's script without a ``__main__`` guard that calls the
    sweep command's ``main`` (``python my_sweep.py RUNS ARGV``, a process of its own; the local
    launcher, the default loader workers) of an ImageFolder tree, one job (the first of the
    tree's four domains as its test environment), into the quick start's kind of
    ``--output_dir``: relative, not there yet (``sweep_output/demo`` in the working directory
    ``root``). ``(root, env, exit status, output)``, read by the tests below. (The command
    itself, ``python -m dg_plugins.scripts.sweep`` with the local launcher, runs in the kill -9
    test above.)"""
    root = tmp_path_factory.mktemp("image_folder_sweep")
    env = command_env()
    data = make_pacs_tree(root / "data", per_class=1, size=16) / "PACS"
    (root / "my_sweep.py").write_text(GUARDLESS_SCRIPT)
    argv = sweep_argv("sweep_output/demo", "--algorithms", "ERM", "--test_env_sets", "0",
                      "--steps", "1", "--hparams", '{"resnet18": true, "pretrained": false, '
                      '"batch_size": 2, "image_size": 32}', data_dir=data,
                      datasets=("ImageFolder",))
    proc = subprocess.Popen([sys.executable, str(root / "my_sweep.py"), str(root / "runs"),
                             *argv], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    code, text = finish(proc, timeout=300)
    return root, env, code, text


def test_collect_results_names_an_image_folder_trees_columns_by_its_domain_folders(
        image_folder_sweep, capsys):
    """An ImageFolder sweep (one job, the first of the tree's four domains as its test
    environment): its records carry the environment names, and collect_results' columns are the
    domain folders (they were 0 1 2 3)."""
    from dg_plugins.collect import cli as collect_cli

    root, _, code, text = image_folder_sweep
    assert code == 0, text
    assert collect_cli.main(["--input_dir", str(root / "sweep_output" / "demo"),
                             "--all_columns"]) == 0
    tables = capsys.readouterr().out
    block = tables.split("model selection method: training-domain validation set\n")[1]
    assert block.splitlines()[0].split() == ["Algorithm", "art_painting", "cartoon", "photo",
                                              "sketch", "Avg"], tables


def test_a_data_dir_one_level_above_the_tree_names_the_folder_meant(tmp_path, capsys,
                                                                    monkeypatch):
    """``--dataset ImageFolder --data_dir`` pointed at the folder above the tree (one "domain"
    whose "classes" are the domains): train (before printing its settings) and the sweep
    (before launching) say which --data_dir was meant, exit 2 and write nothing; they used to
    fail with "leaves no training environment", or launch jobs that failed. (Both ``main``s in
    process: the subject is the message.)"""
    from dg_plugins.sweep import cli as sweep_cli
    from dg_plugins.train import cli as train_cli

    data = make_pacs_tree(tmp_path / "data", per_class=1, size=16)
    meant = f"did you mean --data_dir {data / 'PACS'}?"
    # train's process set-up (cuBLAS's deterministic workspace) stays in this test
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG",
                                                                 ":4096:8"))
    code = train_cli.main(["--dataset", "ImageFolder", "--data_dir", str(data),
                           "--output_dir", str(tmp_path / "job")])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2 and captured.err.endswith(f"{meant}\n") and "HParams" not in text, text
    assert not (tmp_path / "job").exists()
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        sweep_cli.main(sweep_argv(out, "--algorithms", "ERM", "--single_test_envs",
                                  data_dir=data, datasets=("ImageFolder",)))
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.err.endswith(f"{meant}\n"), captured
    assert not out.exists()


def test_jobs_that_failed_on_bad_input_at_their_start_are_not_offered_resume(tmp_path, capfd):
    """Jobs that exit with train's bad-input status before their first checkpoint (here: every
    image of a training domain is unreadable, which the pre-launch check, reading no image,
    cannot see): the sweep says to fix the cause, delete the folders and launch again; a
    --resume would only fail the same way. (The sweep's ``main`` in process, its local
    launcher forking the job.)"""
    from dg_plugins.sweep import cli as sweep_cli

    data = make_pacs_tree(tmp_path / "data", per_class=1, size=16)
    for path in (data / "PACS" / "sketch").rglob("*.jpg"):
        truncate_image(path)
    out = tmp_path / "out"
    argv = sweep_argv(out, "--algorithms", "ERM", "--test_env_sets", "0", "--steps", "2",
                      "--hparams", '{"resnet18": true, "pretrained": false, "batch_size": 2, '
                      '"image_size": 32}', data_dir=data, datasets=("PACS",))
    code = sweep_cli.main(argv)
    text = capfd.readouterr().out
    assert code == 1, text
    assert "Each failed on bad input before its first checkpoint (exit status 2" in text
    [delete] = [line for line in text.splitlines() if "delete_incomplete" in line]
    flags = shlex.join(word for word in argv[1:] if word != "--skip_confirmation")
    assert delete.endswith(f"-m {SWEEP} delete_incomplete {flags}"), delete
    assert "--resume" not in text


# ---------------------------------------------------------------------------------------------
# A script without a __main__ guard


def test_a_script_without_a_main_guard_can_drive_the_local_launcher(image_folder_sweep):
    """The script (the ImageFolder sweep above) runs once (the jobs used to re-run it inside the
    fork server's children: the job failed, its folder stayed empty, the sweep exited 0); the
    job is done."""
    root, _, code, text = image_folder_sweep
    assert code == 0, text
    assert (root / "runs").read_text() == "ran\n"
    [job] = job_folders(root / "sweep_output" / "demo")
    assert (job / "done").exists() and [r["step"] for r in read_records(job)] == [0]
    assert "all 1 commands succeeded" in text and "sweep exit status 0" in text


def test_only_dg_plugins_or_fileless_mains_are_forked(monkeypatch):
    from dg_plugins.sweep import processes as fork

    main = sys.modules["__main__"]
    for spec_name, file, safe in [("dg_plugins.scripts.sweep", "/x/sweep.py", True),
                                  ("pytest.__main__", "/x/__main__.py", True),
                                  ("my_package.run", "/x/run.py", False),
                                  (None, "/home/me/my_sweep.py", False),
                                  (None, None, True)]:
        spec = type("Spec", (), {"name": spec_name})() if spec_name else None
        monkeypatch.setattr(main, "__spec__", spec, raising=False)
        if file is None:
            monkeypatch.delattr(main, "__file__", raising=False)
        else:
            monkeypatch.setattr(main, "__file__", file, raising=False)
        assert fork.main_module_is_reimport_safe() is safe, (spec_name, file)
        command = f"{jobs.python_executable()} -m dg_plugins.scripts.train --steps 3"
        assert (fork.forkable_train_args(command) is not None) is safe


def test_a_relative_output_folder_not_created_yet_is_checked_in_the_working_directory(
        image_folder_sweep):
    """The quick start's ``--output_dir sweep_output/offline_quickstart``: relative, and not there
    yet. The pre-launch check looks for its nearest existing parent from the working directory
    and the job runs (the check once walked up to the folder '' and refused the sweep); no
    process is left behind."""
    root, env, code, text = image_folder_sweep
    assert code == 0, text[-4000:]
    (job,) = job_folders(root / "sweep_output" / "demo")
    assert (job / "done").exists()
    assert not survivors(env)
