"""The decoded-image cache (``dg_plugins.datasets.decoded``) under faults: a lock left held by the
build processes of a job that is gone is taken over; a full disk while building or while keeping
evaluation pixels is one line with the fix, the job reading its image files (never a SIGBUS); an
image replaced in place with its size and modification time is decoded again; cache files
overwritten or truncated are found and built again (what a job reads is always what its images
give); a non-finite budget is named."""

import errno
import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import dg_plugins.compat  # noqa: F401
from dg_plugins import runtime
from dg_plugins.datasets import decoded
from dg_plugins.datasets.image_folder import PACS, load_rgb_image
from dg_plugins.train import evaluate
from dg_plugins.train.splits import split_dataset

from support.forks import forked, forked_result, within
from support.image_tree import make_pacs_tree
from support.processes import command_env, survivors

AUGMENT = {"data_augmentation": True}


def all_read_as_their_files(dataset) -> None:
    for env in dataset.datasets:
        for i, (path, _) in enumerate(env.samples):
            assert np.array_equal(np.asarray(env.image(i)), np.asarray(load_rgb_image(path)))


# ------------------------------------------------------------------------------------------------
# The lock

def hold_and_leave(folder: str) -> int:
    """A job (a child forked from this process) takes ``folder``'s build lock, forks a process
    that inherits it (as a build process forked by a job did) and dies: returns that orphan's
    pid, the lock still held by it."""
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # never returns into pytest
        try:
            os.close(read)
            os.makedirs(folder, exist_ok=True)
            with decoded._folder_lock(folder):
                child = os.fork()  # inherits the lock
                if child == 0:
                    null = os.open(os.devnull, os.O_WRONLY)
                    for fd in (0, 1, 2, write):
                        os.dup2(null, fd)
                    time.sleep(300)
                    os._exit(0)
                os.write(write, f"{child}".encode())
                os._exit(0)  # the holder is gone; its child holds the lock
        finally:
            os._exit(1)
    os.close(write)
    with within(60):
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read().decode()
        _, status = os.waitpid(holder, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and said, (status, said)
    return int(said)


def test_a_lock_held_by_the_processes_of_a_job_that_is_gone_is_taken_over(tmp_path, cache,
                                                                           capsys):
    """A job killed while processes it forked hold its build lock (build processes of a version
    without the parent-death signal): the next job takes the lock over and builds (before, it
    waited for them forever)."""
    root = make_pacs_tree(tmp_path / "tree", per_class=1, size=32)
    dataset = PACS(str(root), [0], AUGMENT)
    folder = decoded.DatasetCache(dataset).folder
    orphan = hold_and_leave(folder)
    try:
        with within(60):
            line = decoded.prepare(dataset)
        assert runtime.pid_alive(orphan)  # it still holds the old lock file
    finally:
        os.kill(orphan, signal.SIGKILL)
    assert line.startswith("Decoded-image cache: built"), line
    said = capsys.readouterr().out
    assert "is gone but processes it started hold its lock; taking the build over" in said
    all_read_as_their_files(dataset)


BUILDING = """
import os, sys, time
from dg_plugins.datasets import decoded

def files(_):
    return [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]

os.makedirs(sys.argv[1], exist_ok=True)
with decoded._folder_lock(sys.argv[1]):
    lock = os.path.join(sys.argv[1], decoded.LOCK_NAME)
    builders = decoded.Builders([], cores=2)
    print(lock in files(0), [lock in f for f in builders.map(files, [(0,), (1,)])], flush=True)
    time.sleep(300)
"""


def test_build_processes_die_with_their_job_and_do_not_hold_its_lock(tmp_path):
    """A build process closed its copy of the job's build lock, and has the parent-death signal
    (or a watch): with its job killed (``kill -9``) it ends at once."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc here")
    env = command_env()
    proc = subprocess.Popen([sys.executable, "-c", BUILDING, str(tmp_path / "folder")], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        held = proc.stdout.readline()
        assert held.strip() == "True [False, False]", held  # the job holds it, they do not
        proc.kill()
        proc.wait()
        left = survivors(env, wait=30)
    finally:
        proc.kill()
        proc.wait()
    assert not left, f"build processes outlived their job: {left}"


# ------------------------------------------------------------------------------------------------
# A full disk


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("cores", [1, 2])
def test_a_full_disk_while_building_is_one_line_and_the_job_reads_its_files(
        tmp_path, cache, monkeypatch, cores):
    """The disk fills while the cache is built, with one build process or two: the files are
    allocated before they are written, so the job hears ENOSPC (never a SIGBUS), says it in one
    line naming the folder and the fix, leaves no partial file, and reads its images."""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=32)
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset, cores=cores)
    folder = decoded.DatasetCache(dataset).folder
    assert line.startswith("Decoded-image cache: not used"), line
    assert f"no space left on the disk of {folder}" in line, line
    assert "free space there or set DG_PLUGINS_CACHE to a folder on a disk with room" in line
    assert sorted(p.name for p in (cache / os.path.basename(folder)).iterdir()
                  if not p.name.startswith(".")) == []
    assert all(env.decoded is None for env in dataset.datasets)
    x, _ = dataset.datasets[1][0]
    assert x.shape == (3, 224, 224)


def test_a_disk_that_fills_after_some_files_keeps_them_and_says_so(tmp_path, cache,
                                                                    monkeypatch):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=32)
    calls, allocate = [], os.posix_fallocate

    def fills(fd, offset, length):
        calls.append(length)
        if len(calls) > 1:
            no_space()
        allocate(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fills)
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset)
    assert line.startswith("Decoded-image cache: built (decoded images) for PACS (1 of 4"), line
    assert "no space left on the disk" in line, line
    monkeypatch.undo()
    all_read_as_their_files(dataset)


def splits_of(root, cache_on: bool):
    dataset = PACS(str(root), [0], AUGMENT)
    if cache_on:
        decoded.prepare(dataset)
    augmented_out, augmented_in = split_dataset(dataset.datasets[2], 4, seed=2)
    return [(augmented_in, 12), (augmented_out, 14)]


def batches_of(datasets):
    return list(evaluate.eval_batches_of(datasets, 3, 0))


def same_batches(got, want) -> bool:
    return len(got) == len(want) and all(
        j == k and torch.equal(x, u) and torch.equal(y, v)
        for (j, x, y), (k, u, v) in zip(got, want))


def test_a_full_disk_while_keeping_evaluation_pixels_is_one_line_and_the_evaluation_goes_on(
        tmp_path, cache, monkeypatch, capsys):
    """(Before, a SIGBUS with any number of workers.)"""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=32)
    want = batches_of(splits_of(root, cache_on=False))
    datasets = splits_of(root, cache_on=True)
    capsys.readouterr()
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    assert same_batches(batches_of(datasets), want)
    folder = next(cache.iterdir())
    assert not [p for p in folder.iterdir() if ".eval-" in p.name]
    notes = [x for x in capsys.readouterr().err.splitlines() if "no space left" in x]
    assert len(notes) == 1 and str(folder) in notes[0] and "DG_PLUGINS_CACHE" in notes[0], notes


def job_on_a_full_disk(root, cache: str, fallocate: str, cores: int) -> str:
    """A job's preparation (in a forked child) with its cache on ``cache``, the room check out of
    the way; ``fallocate`` "without": as where the system cannot allocate (the writes meet the
    full disk)."""
    os.environ["DG_PLUGINS_CACHE"] = cache
    decoded._disk_room = lambda folder: 2 ** 40  # no room kept: the build meets the full disk
    if fallocate == "without":
        del os.posix_fallocate
    return decoded.prepare(PACS(str(root), [0], {"data_augmentation": True}), cores)


@pytest.mark.parametrize("fallocate, cores", [("with", 1), ("without", 2)])
def test_a_real_full_disk_is_an_error_not_a_bus_error(tmp_path, small_disk, fallocate, cores):
    """On a real 100 KB disk (a tmpfs; skipped where mounting is not permitted), with the room
    check out of the way, the build meets ENOSPC: allocating a file, or (without fallocate)
    writing it in a build process; the job (a process forked from this one, where a SIGBUS
    would end it) goes on (before, SIGBUS)."""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    status, said = forked_result(*forked(job_on_a_full_disk, root, str(small_disk), fallocate,
                                         cores))
    left = [p.name for p in (small_disk / "decoded").rglob("*.tmp.*")]
    assert status == 0, (status, said[-2000:])
    assert "no space left on the disk of" in said, said
    assert not left, left


# ------------------------------------------------------------------------------------------------
# Stale and damaged files


def rewrite_keeping_size_and_mtime(path) -> None:
    """Put another picture in ``path`` in place (same inode), with its byte size and
    modification time kept (a JPEG padded after its end marker)."""
    from PIL import Image, ImageOps

    stat = os.stat(path)
    with Image.open(path) as image:
        other = ImageOps.invert(image.convert("RGB"))
    for quality in (90, 70, 50, 30, 10):
        buffer = io.BytesIO()
        other.save(buffer, "JPEG", quality=quality)
        data = buffer.getvalue()
        if len(data) <= stat.st_size:
            break
    with open(path, "r+b") as handle:
        handle.write(data + bytes(stat.st_size - len(data)))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (stat.st_size, stat.st_mtime_ns,
                                                                stat.st_ino)


def test_an_image_replaced_in_place_with_its_size_and_mtime_is_decoded_again(tmp_path, cache):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    decoded.prepare(PACS(str(root), [0], AUGMENT))
    image = sorted((root / "PACS" / "photo").rglob("*.jpg"))[1]
    before = np.asarray(load_rgb_image(str(image)))
    rewrite_keeping_size_and_mtime(image)
    assert not np.array_equal(np.asarray(load_rgb_image(str(image))), before)
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset)
    assert line.startswith("Decoded-image cache: built"), line
    all_read_as_their_files(dataset)


def entry_files(cache, pattern):
    return sorted(next(cache.iterdir()).glob(pattern))


def overwrite(path, offset, data: bytes, keep_mtime=True) -> None:
    stat = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_overwritten_or_truncated_cache_files_are_found_and_built_again(tmp_path, cache,
                                                                        capsys):
    """Bytes of a decoded file overwritten (its modification time put back), a plain-pixels
    file and an index truncated: the next job names each damaged file, removes it, builds it
    again and reads what the images give (before: the overwritten pixels were used, and the
    truncated files failed with "cannot reshape" or "mmap length is greater than file size" on
    every rerun). A file only touched (same bytes) is reused."""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    first = PACS(str(root), [0], AUGMENT)
    decoded.prepare(first)
    photo, sketch = (entry_files(cache, f"{name}-*.decoded")[0] for name in ("photo", "sketch"))
    middle = os.path.getsize(photo) // 2
    overwrite(photo, middle, bytes(255 - b for b in photo.read_bytes()[middle:middle + 600]))
    (plain,) = entry_files(cache, "art_painting-*.plain-*[0-9a-f].npy")
    os.truncate(plain, os.path.getsize(plain) // 2)
    (index,) = entry_files(cache, "cartoon-*.decoded.index.npy")
    os.truncate(index, 100)
    touched = entry_files(cache, "sketch-*.decoded")[0]
    os.utime(touched)  # a new modification time, the same bytes
    inode = os.stat(touched).st_ino
    capsys.readouterr()
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset)
    assert line.startswith("Decoded-image cache: built"), line
    for path in (photo, plain, index):
        assert f"damaged: {path}" in line, (path, line)
    assert str(sketch) not in line and os.stat(touched).st_ino == inode  # reused
    all_read_as_their_files(dataset)
    env = dataset.datasets[0]
    (split,) = env.evaluation_pixel_transforms()
    entry = env.pixel_store.plain_entry(split)
    for i in range(len(env)):
        assert np.array_equal(entry.read(i), split.pixels(env.image(i)).numpy())
    assert decoded.prepare(PACS(str(root), [0], AUGMENT)).startswith(
        "Decoded-image cache: reused")


def test_damaged_evaluation_pixels_are_made_again(tmp_path, cache, capsys):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    want = batches_of(splits_of(root, cache_on=False))
    assert same_batches(batches_of(splits_of(root, cache_on=True)), want)
    kept = entry_files(cache, "*.eval-*.npy")
    assert len(kept) == 2
    overwrite(kept[0], os.path.getsize(kept[0]) - 300, bytes(300), keep_mtime=False)
    os.truncate(kept[1], 200)
    capsys.readouterr()
    assert same_batches(batches_of(splits_of(root, cache_on=True)), want)
    notes = capsys.readouterr().err
    assert all(f"damaged: {path}" in notes for path in kept), notes
    assert same_batches(batches_of(splits_of(root, cache_on=True)), want)  # made again, intact
    assert not capsys.readouterr().err


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "-1", "lots"])
def test_a_bad_budget_is_named_with_its_valid_values(monkeypatch, value):
    monkeypatch.setenv(decoded.BUDGET_ENV, value)
    with pytest.raises(ValueError) as raised:
        decoded.budget_bytes()
    message = str(raised.value)
    assert message.startswith(f"${decoded.BUDGET_ENV}={value!r} is not a size in GB"), message
    assert "finite number >= 0" in message and "\n" not in message
