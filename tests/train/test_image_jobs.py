"""The commands users run on an image-folder dataset, with the loader workers they get by default
(no ``--n_workers``), started as subprocesses under a timeout, so that a hang fails the test:
train's normal finish (a UDG job from scratch; an ERM job resumed to its end), a decode error in
a training stream and in evaluation, a NaN stop, SIGTERM/SIGINT mid-run then ``--resume`` (and a
refused resume), a ``local``-launcher sweep (interrupted, then resumed to the end of all its
jobs and collected), and the job's live loader workers never above its budget. (Exact resume
with augmentation: ``test_resume_augmentation.py``.) After every exit no process of the command
may be left (loader workers included). The refused resume's message and collect_results' table
are the subject there, not a process: their commands' ``main`` runs in this process."""

import json
import os
import signal
import time

import pytest

from support.image_tree import PACS_DOMAINS, make_pacs_tree, truncate_image
from support.job_gate import gate_env, released, wait_at_gate
from support.processes import command_env, finish, run, start, survivors
from support.helpers import read_records

from dg_plugins.scripts import collect_results
from dg_plugins.scripts.train import main as train_main

TRAIN = "dg_plugins.scripts.train"
SWEEP = "dg_plugins.scripts.sweep"
#: A tiny random-init ViT at 224x224: the dataset's real transforms, decoded in loader workers.
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32})
TIMEOUT = 120


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_pacs_tree(tmp_path_factory.mktemp("pacs_tree"), per_class=2, size=32)


@pytest.fixture
def broken_tree(tmp_path):
    """A PACS tree whose ``env`` domain has only undecodable JPEGs (set by the test)."""

    def make(env: int):
        root = make_pacs_tree(tmp_path / "broken", per_class=2, size=32)
        for path in (root / "PACS" / PACS_DOMAINS[env]).rglob("*.jpg"):
            truncate_image(path)
        return root

    return make


def train_args(data_dir, out, *extra, algorithm="ERM", steps=3):
    return ["--dataset", "PACS", "--data_dir", data_dir, "--algorithm", algorithm,
            "--test_envs", "0", "--steps", steps, "--hparams", HPARAMS, "--output_dir", out,
            *extra]


def assert_nothing_left(env):
    left = survivors(env)
    assert not left, f"processes outlived their command: {left}"


def used_workers(out_txt: str) -> int:
    line = next(line for line in out_txt.splitlines() if "loader workers:" in line)
    return int(line.split("loader workers:")[1].split()[0])


def test_udg_job_pretrains_with_workers_and_exits(tree, tmp_path):
    """A UDG job (MAE, a tiny ViT) from scratch to its normal finish: the unlabelled pretraining
    streams decode in loader workers too; pretraining, fine-tuning and evaluation end and no
    worker is left."""
    env = command_env()
    out = tmp_path / "udg" / "job"
    hparams = json.dumps({"vit_arch": "tiny", "batch_size": 4, "dismae_decoder_width": 32})
    code, output = run(TRAIN, "--dataset", "PACS", "--data_dir", tree, "--algorithm", "MAE",
                       "--test_envs", "0", "--steps", 2, "--label_fraction", 0.5,
                       "--pretrain_steps", 2, "--hparams", hparams, "--output_dir", out,
                       env=env, timeout=TIMEOUT)
    assert code == 0, output
    text = (out / "out.txt").read_text()
    assert used_workers(text) >= 1 and "UDG pretraining data (domainbed split)" in text
    (pretraining,) = (tmp_path / "udg" / "udg_pretrain").iterdir()
    assert (pretraining / "done").exists() and (out / "done").exists()
    assert_nothing_left(env)


@pytest.mark.parametrize("broken_env, where", [(1, "training stream"), (0, "evaluation")])
def test_decode_error_names_the_file_and_exits(broken_tree, tmp_path, broken_env, where):
    """A source domain's broken images fail in a training stream's workers; a test domain's in an
    evaluation loader's workers. Either way the file is named and the process exits."""
    env = command_env()
    out = tmp_path / "job"
    code, output = run(TRAIN, *train_args(broken_tree(broken_env), out), env=env,
                       timeout=TIMEOUT)
    assert code == 2, output
    assert PACS_DOMAINS[broken_env] in output and ".jpg" in output, output
    assert not (out / "done").exists()
    assert_nothing_left(env)


def test_nan_stop_exits(tree, tmp_path):
    env = command_env(DG_PLUGINS_IMPORT="support.e2e_algorithms")
    out = tmp_path / "job"
    code, output = run(TRAIN, *train_args(tree, out, algorithm="NaNERM", steps=6), env=env,
                       timeout=TIMEOUT)
    assert code == 1 and "loss=nan at step 2" in output, output
    assert not (out / "done").exists()
    assert_nothing_left(env)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_then_resume(tree, tmp_path, signum, capsys):
    """The signal goes to the job's whole process group (as a sweep or a terminal sends it)
    while the job trains (held after step 1 by the test's gate): the workers ignore it, train
    checkpoints at the step boundary and exits 128 + signum, and every worker is gone; a resume
    with other arguments is refused (train's ``main`` in this process: the message is the
    subject); the right one finishes normally, with loader workers (the default path really has
    them), and leaves no process."""
    gate = tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=1)
    out = tmp_path / "job"
    args = train_args(tree, out, "--checkpoint_freq", "3", steps=4)
    proc = start(TRAIN, *args, env=env)
    with released(gate):
        wait_at_gate(gate, proc, TIMEOUT)
        os.killpg(proc.pid, signum)
        code, output = finish(proc, TIMEOUT)
    assert code == 128 + signum, output
    assert f"stopped by {signal.Signals(signum).name} after step 1" in output
    assert (out / "checkpoint.pt").exists() and not (out / "done").exists()
    assert_nothing_left(env)
    if signum == signal.SIGINT:
        return
    refused = train_args(tree, out, "--checkpoint_freq", "3", "--resume", steps=5)
    capsys.readouterr()
    code = train_main([str(a) for a in refused])
    output = "".join(capsys.readouterr())  # the job's output (stdout) and stderr
    assert code == 2 and "--steps: 4 in the checkpoint, 5 now" in output, output
    code, output = run(TRAIN, *args, "--resume", env=env, timeout=TIMEOUT)
    assert code == 0, output
    assert [r["step"] for r in read_records(out)] == [0, 3]
    assert (out / "done").exists()
    assert used_workers(output) >= 1, output  # the resumed run's own loader workers
    assert_nothing_left(env)


def sweep_args(data_dir, out, *extra, algorithms=("ERM",)):
    return ["launch", "--datasets", "PACS", "--data_dir", data_dir, "--output_dir", out,
            "--algorithms", *algorithms, "--command_launcher", "local", "--n_hparams", "1",
            "--n_trials", "1", "--hparams", HPARAMS, "--skip_confirmation", *extra]


def test_local_sweep_interrupted_then_resumed_runs_every_job_and_collects(tree, tmp_path,
                                                                          capsys):
    """A sweep of four jobs (one per test domain) stopped by SIGTERM while its first job trains
    (held after step 1 by the test's gate): the sweep forwards the signal, exits 143 and says
    to --resume, and no process is left; the resumed sweep continues the first job, runs the
    three others to the end, and collect_results (its ``main`` in this process: the table is
    the subject) tabulates all four."""
    gate = tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=1)  # the first job waits after step 1 until it is stopped
    out = tmp_path / "sweep"
    args = sweep_args(tree, out, "--single_test_envs", "--steps", "4", "--checkpoint_freq", "3")
    proc = start(SWEEP, *args, env=env)
    with released(gate):
        wait_at_gate(gate, proc, TIMEOUT)
        os.kill(proc.pid, signal.SIGTERM)  # the sweep forwards it to the running job
        code, output = finish(proc, TIMEOUT)
    assert code == 143 and "--resume" in output, output
    assert_nothing_left(env)
    stopped = [p for p in out.iterdir() if (p / "results.jsonl").exists()]
    assert len(stopped) == 1 and (stopped[0] / "checkpoint.pt").exists(), output
    code, output = run(SWEEP, *args, "--resume", env=env, timeout=4 * TIMEOUT)
    assert code == 0, output
    jobs = [p for p in out.iterdir() if (p / "results.jsonl").exists()]
    assert len(jobs) == 4 and all((p / "done").exists() for p in jobs), output
    assert all([r["step"] for r in read_records(p)] == [0, 3] for p in jobs)
    assert_nothing_left(env)
    capsys.readouterr()
    code = collect_results.main(["--input_dir", str(out)])
    tables = capsys.readouterr().out
    assert code == 0, tables
    block = tables.split("model selection method: training-domain validation set\n")[1]
    header, erm = block.splitlines()[:2]
    assert header.split() == ["Algorithm", "A", "C", "P", "S", "Avg"], tables
    assert erm.startswith("ERM ") and "X" not in erm.split(), tables  # all 4 jobs tabulated


#: Whether this kernel lists a thread's children in /proc (``CONFIG_PROC_CHILDREN``).
HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def child_pids(pid: int) -> list[str]:
    """The child processes of ``pid`` (zombies too) from its threads' /proc children lists: a few
    small reads (this test samples every few ms). Where the kernel has no such lists, every
    process in /proc (:func:`live_children` keeps those whose parent is ``pid``)."""
    if not HAS_CHILDREN_FILES:
        return list(filter(str.isdigit, os.listdir("/proc")))
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the job exited
        return []
    children = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += f.read().split()
        except OSError:  # that thread ended between the reads
            pass
    return children


def live_children(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``, from /proc."""
    children = []
    for entry in child_pids(pid):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.append(int(entry))
    return children


def test_loader_workers_never_exceed_the_budget(tree, tmp_path):
    """A 3-source job (PACS, test env 0) with a budget of 2 loader workers: at no moment of its
    training and evaluations does it run more than 2 child processes (it used to run one
    training loader per source, 3 workers, and 2 more for each evaluation beside them)."""
    env = command_env(DG_PLUGINS_IMPORT="support.e2e_algorithms")
    out = tmp_path / "job"
    proc = start(TRAIN, *train_args(tree, out, "--checkpoint_freq", "2", "--n_workers", "2",
                                    algorithm="SlowERM", steps=3), env=env)
    most, samples = 0, 0
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        children = live_children(proc.pid)
        most, samples = max(most, len(children)), samples + bool(children)
        time.sleep(0.005)
    code, output = finish(proc, TIMEOUT)
    assert code == 0, output
    assert used_workers((out / "out.txt").read_text()) == 2
    assert samples > 0, "never saw a loader worker: the test watched nothing"
    assert most <= 2, f"the job ran {most} child processes at once (budget 2)"
    assert_nothing_left(env)
