"""Image jobs with the decoded-image cache (on by default, ``dg_plugins.datasets.decoded``), run as
users run them (subprocesses): the records of a job that builds the cache, of a job that reuses it
(and the augmented splits' evaluation pixels a first job kept), with any number of loader
workers, equal bit for bit the records of a job with the cache off; each job says what it did
with the cache, where it is and how to clear it. Faults: a job killed while it builds (its build
processes die with it, the next job runs), a job waiting for another's build (one SIGTERM stops
it), a full cache disk (one line, the job goes on, the same records), a bad budget (one line;
checked in-process, the message being its subject)."""

import errno
import json
import os
import signal
import time

import pytest

from support.helpers import VOLATILE_KEYS, read_records
from support.image_tree import make_pacs_tree
from support.processes import command_env, finish, run, start, survivors

TRAIN = "dg_plugins.scripts.train"
#: A tiny random-init ViT at 224x224; augmentation on (every image dataset's default), so the
#: training environments' splits are evaluated augmented.
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32})
TIMEOUT = 180


def train_args(tree, out, workers=0):
    return ("--dataset", "PACS", "--data_dir", tree, "--algorithm", "ERM", "--test_envs", "0",
            "--steps", "3", "--checkpoint_freq", "2", "--hparams", HPARAMS, "--n_workers",
            workers, "--output_dir", out)


def cache_line(out) -> str:
    (line,) = [x for x in (out / "out.txt").read_text().splitlines()
               if x.startswith("Decoded-image cache:") and " for PACS " in x]
    return line


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The image tree of the uncached reference job and the full-disk job (neither changes it;
    the records test writes the same images into a tree of its own, which it changes)."""
    return make_pacs_tree(tmp_path_factory.mktemp("tree"), per_class=2, size=40)


@pytest.fixture(scope="module")
def uncached_records(tree, tmp_path_factory):
    """The records of the job with the cache off (1 loader worker), which the others equal."""
    folder = tmp_path_factory.mktemp("uncached")
    out = folder / "job"
    code, output = run(TRAIN, *train_args(tree, out, workers=1),
                       env=command_env(DG_PLUGINS_CACHE=str(folder / "cache"),
                                       DG_PLUGINS_DECODED_CACHE="off"), timeout=TIMEOUT)
    assert code == 0, output
    (line,) = [x for x in (out / "out.txt").read_text().splitlines()
               if x.startswith("Decoded-image cache:")]
    assert line.startswith("Decoded-image cache: off"), line
    records = read_records(out, drop=VOLATILE_KEYS)
    assert len(records) == 2
    return records


def fifo_image(tree):
    """Make one image of ``tree`` a FIFO, so that the process reading it blocks until the test
    writes the image's bytes (:func:`open_once_read`); returns ``(path, bytes)``."""
    image = sorted((tree / "PACS" / "sketch").rglob("*.jpg"))[0]
    saved = image.read_bytes()
    image.unlink()
    os.mkfifo(image)
    return image, saved


def open_once_read(fifo, proc, out) -> int:
    """The FIFO's writing end, opened once a process (a build process of ``proc``) opened it
    for reading: that process is then at work, blocked reading it."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            assert err.errno == errno.ENXIO, err
            assert proc.poll() is None, (out / "err.txt").read_text()
            assert time.monotonic() < deadline, "no build process read the images"
            time.sleep(0.1)


def wait_for_text(path, text: str, proc) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, (
            path.read_text() if path.exists() else f"no {path}")
        time.sleep(0.2)


def test_records_are_the_same_with_and_without_the_cache_and_any_workers(tmp_path,
                                                                         uncached_records):
    """The cache built by a job without loader workers, then reused by one with 2, gives the
    records of the job with the cache off (1 worker). Before the build, ``kill -9`` of a job while
    its build processes work (as the OOM killer does): they die with it, so the next job on the
    dataset builds the cache instead of waiting for them forever (before, they lived on holding
    the cache's lock)."""
    tree = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)  # the images of ``tree``
    image, saved = fifo_image(tree)
    cache = tmp_path / "cache"
    env = command_env(DG_PLUGINS_CACHE=str(cache), DG_PLUGINS_DECODED_CACHE="on")
    proc = start(TRAIN, *train_args(tree, tmp_path / "killed", workers=2), env=env)
    fifo = None
    try:
        fifo = open_once_read(image, proc, tmp_path / "killed")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)  # not its output: build processes that outlive it hold the pipe
        proc.stdout.close()
        image.unlink()
        image.write_bytes(saved)
        # the cache built without workers (in the job's process: its RNGs untouched)
        built = run(TRAIN, *train_args(tree, tmp_path / "job0"),
                    env=command_env(DG_PLUGINS_CACHE=str(cache), DG_PLUGINS_DECODED_CACHE="on"),
                    timeout=TIMEOUT)
        left = survivors(env, wait=10)
    finally:
        if fifo is not None:
            os.close(fifo)
        survivors(env, wait=0)
    assert not left, f"build processes outlived their killed job: {left}"
    # then reused with 2 workers; the uncached records (1 worker) make the third number of workers
    for k, (state, workers) in enumerate((("built", 0), ("reused", 2))):
        out = tmp_path / f"job{k}"
        if k:
            env = command_env(DG_PLUGINS_CACHE=str(cache), DG_PLUGINS_DECODED_CACHE="on")
            code, output = run(TRAIN, *train_args(tree, out, workers), env=env, timeout=TIMEOUT)
        else:
            code, output = built
        assert code == 0, output
        line = cache_line(out)
        assert line.startswith(f"Decoded-image cache: {state}"), line
        assert f"rm -r {cache / 'decoded'}" in line and "GB on disk" in line, line
        assert read_records(out, drop=VOLATILE_KEYS) == uncached_records
    kept = [p.name for p in (cache / "decoded").rglob("*.eval-*.npy")]
    assert len(kept) == 6, kept  # the training environments' in- and out-splits, augmented


def test_jobs_building_or_waiting_for_the_cache_stop_at_the_first_sigterm(tmp_path):
    """One job builds the cache (a build process blocked reading an image), another waits for
    it and says so: one SIGTERM ends each, with one line saying what it was doing and the
    signal's exit status, no traceback (before, the waiting job went on waiting, and a second
    SIGTERM ended it with a traceback); the build's unfinished files are removed."""
    tree = make_pacs_tree(tmp_path / "tree", per_class=1, size=32)
    image, saved = fifo_image(tree)
    env = command_env(DG_PLUGINS_CACHE=str(tmp_path / "cache"))
    builds = start(TRAIN, *train_args(tree, tmp_path / "builds", workers=2), env=env)
    fifo = None
    try:
        fifo = open_once_read(image, builds, tmp_path / "builds")
        waits = start(TRAIN, *train_args(tree, tmp_path / "waits"), env=env)
        wait_for_text(tmp_path / "waits" / "out.txt", "waiting for it", waits)
        os.kill(waits.pid, signal.SIGTERM)
        waited = finish(waits, timeout=60)
        os.kill(builds.pid, signal.SIGTERM)
        os.set_blocking(fifo, True)
        os.write(fifo, saved)  # the build process reads the image and ends its task
        os.close(fifo)
        fifo = None
        built = finish(builds, timeout=60)
    finally:
        if fifo is not None:
            os.close(fifo)
        survivors(env, wait=0)
    for (code, output), doing in ((waited, "waiting for another job's build"),
                                  (built, "building the decoded-image cache")):
        assert code == 128 + signal.SIGTERM, output
        assert f"stopped: stopped by SIGTERM while {doing}" in output, output
        assert "rerun the same command" in output and "Traceback" not in output, output
    (folder,) = (tmp_path / "cache" / "decoded").iterdir()
    assert not [p.name for p in folder.iterdir() if not p.name.startswith(".")]


def test_a_full_cache_disk_is_one_line_and_the_job_gives_the_same_records(tmp_path, tree,
                                                                          uncached_records,
                                                                          small_disk):
    """The cache's disk too small for its files: the job goes on from the image files, says
    so in one line naming the folder and the fix, and writes the records of a job with the cache
    off (before, one build process killed it with SIGBUS, rc 135, on every rerun)."""
    out = tmp_path / "full"
    code, output = run(TRAIN, *train_args(tree, out),
                       env=command_env(DG_PLUGINS_CACHE=str(small_disk),
                                       DG_PLUGINS_DECODED_CACHE="on"), timeout=TIMEOUT)
    assert code == 0, output
    line = cache_line(out)
    assert f"the disk of {small_disk / 'decoded'}" in line, line
    assert "free space there or set DG_PLUGINS_CACHE to a folder on a disk with room" in line
    assert read_records(out, drop=VOLATILE_KEYS) == uncached_records


def test_an_infinite_budget_is_one_line_naming_the_variable(tmp_path, capsys, monkeypatch):
    """(Before, an OverflowError's traceback.) In-process: the message is the subject."""
    from dg_plugins.scripts.train import main

    tree = make_pacs_tree(tmp_path / "tree", per_class=1, size=32)
    monkeypatch.setenv("DG_PLUGINS_DECODED_BUDGET_GB", "inf")
    monkeypatch.setenv("DG_PLUGINS_CACHE", str(tmp_path / "cache"))
    assert main(list(map(str, train_args(tree, tmp_path / "job")))) == 2
    output = "".join(capsys.readouterr())
    assert "error: $DG_PLUGINS_DECODED_BUDGET_GB='inf' is not a size in GB" in output, output
    assert "finite number >= 0" in output and "Traceback" not in output, output
