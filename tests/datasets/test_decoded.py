"""The decoded-image cache (``dg_plugins.datasets.decoded``): transforms split into a pixel part
and a ToTensor + Normalize table that gives the transform's floats bit for bit; every image
decoded once into the cache with the pixels PIL gives (unreadable images left out, so the normal
path reports them); files renewed when the images change; the budget, the switch, the lock; and
evaluation and training batches from the cache equal to the batches made from the files."""

import contextlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import dg_plugins.compat  # noqa: F401
from dg_plugins.datasets import decoded
from dg_plugins.datasets.image_folder import (PACS, UnreadableImageError, load_rgb_image,
                                              plain_transform, training_transform)
from dg_plugins.seeds import seeded_rng
from dg_plugins.train import batches, evaluate
from dg_plugins.train.splits import split_dataset

from support.forks import forked, forked_result
from support.image_tree import make_pacs_tree, truncate_image

AUGMENT = {"data_augmentation": True}



def pictures(n=6, seed=0):
    """RGB PIL images of various sizes with random pixels (every byte value occurs)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
            for h, w in zip(rng.integers(40, 300, n), rng.integers(40, 300, n))]


@pytest.mark.parametrize("name", ["plain", "domainbed", "dmg_pacs", "dmg_domainnet"])
def test_the_pixel_part_and_the_table_give_the_transforms_floats_bit_for_bit(name):
    transform = plain_transform() if name == "plain" else training_transform(name)
    split = decoded.split_transform(transform)
    assert split is not None and split.deterministic == (name == "plain")
    for k, image in enumerate(pictures()):
        with seeded_rng(k):
            want = transform(image)
        with seeded_rng(k):
            pixels = split.pixels(image)
        assert pixels.dtype == torch.uint8 and pixels.shape == want.shape
        got = decoded.to_model_input(pixels[None], split.table, "cpu")[0]
        assert got.is_contiguous() and torch.equal(got, want), name


def test_transforms_that_do_not_split_are_left_whole():
    from torchvision import transforms as T

    normalize = T.Normalize((0.5,) * 3, (0.2,) * 3)
    assert decoded.split_transform(None) is None
    assert decoded.split_transform(T.Compose([T.Lambda(lambda x: x), T.ToTensor(),
                                              normalize])) is None
    assert decoded.split_transform(T.Compose([T.Resize(8), T.ToTensor()])) is None
    assert decoded.split_transform(T.Compose([T.Resize(8), normalize, T.ToTensor()])) is None
    assert decoded.split_transform(T.Compose([T.Resize(8), T.ToTensor(), normalize])) is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_device_conversion_equals_the_cpus():
    split = decoded.split_transform(plain_transform())
    pixels = torch.stack([split.pixels(image) for image in pictures()[:1] * 3])
    cpu = decoded.to_model_input(pixels, split.table, "cpu")
    cuda = decoded.to_model_input(pixels.pin_memory(), split.table, "cuda")
    assert cuda.is_contiguous() and torch.equal(cuda.cpu(), cpu)


def odd_images(root):
    """Images that PIL decodes through ``to_rgb``'s other branches: 16-bit grey, palette, grey
    with alpha, CMYK (added to the tree's first class folder of each of two domains)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    folder = next(p for p in sorted((root / "PACS" / "photo").iterdir()) if p.is_dir())
    Image.fromarray(rng.integers(0, 65535, (30, 20), dtype=np.uint16)).save(folder / "z16.png")
    Image.fromarray(rng.integers(0, 256, (25, 31, 3), dtype=np.uint8)).convert(
        "P", palette=Image.ADAPTIVE).save(folder / "zp.png")
    Image.fromarray(rng.integers(0, 256, (22, 22, 2), dtype=np.uint8), "LA").save(
        folder / "zla.png")
    Image.fromarray(rng.integers(0, 256, (20, 26, 4), dtype=np.uint8), "CMYK").save(
        folder / "zc.jpg")


def test_every_image_is_cached_with_the_pixels_pil_decodes_and_unreadable_ones_left_out(
        tmp_path, cache):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    odd_images(root)
    broken = sorted((root / "PACS" / "cartoon").rglob("*.jpg"))[1]
    truncate_image(broken)
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset, cores=2)
    assert line.startswith("Decoded-image cache: built") and str(cache) in line, line
    assert f"rm -r {cache}" in line and decoded.BUDGET_ENV in line and "=off" in line
    for env in dataset.datasets:
        assert env.decoded is not None and env.pixel_store is not None
        for i, (path, _) in enumerate(env.samples):
            if path == str(broken):
                assert not env.decoded.has(i)
                with pytest.raises(UnreadableImageError, match=broken.name):
                    env[i]  # read from its file, where the error is raised as before
                continue
            assert env.decoded.has(i)
            assert np.array_equal(np.asarray(env.image(i)), np.asarray(load_rgb_image(path)))
    # the test environment's plain transform: its evaluation pixels per item
    test_env = dataset.datasets[0]
    (split,) = test_env.evaluation_pixel_transforms()
    entry = test_env.pixel_store.plain_entry(split)
    assert entry is not None and entry.ok.all()
    for i in range(len(test_env)):
        assert np.array_equal(entry.read(i), split.pixels(test_env.image(i)).numpy())
    # a second job reuses every file
    again = PACS(str(root), [0], AUGMENT)
    assert decoded.prepare(again, cores=1).startswith("Decoded-image cache: reused")


def test_changed_images_make_new_files_and_the_old_ones_go(tmp_path, cache):
    from PIL import Image

    root = make_pacs_tree(tmp_path / "tree", per_class=1, size=32)
    decoded.prepare(PACS(str(root), [0], AUGMENT))
    before = set(os.listdir(next(cache.iterdir())))
    image = sorted((root / "PACS" / "sketch").rglob("*.jpg"))[0]
    Image.new("RGB", (50, 20), (1, 2, 3)).save(image)
    dataset = PACS(str(root), [0], AUGMENT)
    assert "built" in decoded.prepare(dataset)
    after = set(os.listdir(next(cache.iterdir())))
    changed = {name for name in before ^ after if not name.startswith(".")}
    assert changed and all(name.startswith("sketch") for name in changed), changed
    env = dataset.datasets[3]
    i = [path for path, _ in env.samples].index(str(image))
    assert np.asarray(env.image(i)).shape == (20, 50, 3)


def test_over_the_budget_the_job_reads_its_files_and_says_how_to_cache(tmp_path, cache,
                                                                        monkeypatch):
    root = make_pacs_tree(tmp_path / "tree", per_class=1, size=64)
    monkeypatch.setenv(decoded.BUDGET_ENV, "0")
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset)
    assert "not used" in line and f"{decoded.BUDGET_ENV}=1" in line, line
    assert all(env.decoded is None for env in dataset.datasets)
    x, y = dataset.datasets[0][0]
    assert x.shape == (3, 224, 224)
    # room for the evaluation pixels (3 x 224 x 224 per test image) but not the decoded images
    size = 3 * 224 * 224 * len(dataset.datasets[0])
    monkeypatch.setenv(decoded.BUDGET_ENV, str((size + 1000) / 2**30))
    dataset = PACS(str(root), [0], AUGMENT)
    line = decoded.prepare(dataset)
    assert "decoded images" in line and "not cached" in line, line
    assert dataset.datasets[0].decoded is None and dataset.datasets[0].pixel_store.plain


def test_the_switch_turns_it_off_and_a_bad_budget_is_named(tmp_path, cache, monkeypatch):
    root = make_pacs_tree(tmp_path / "tree", per_class=1, size=32)
    monkeypatch.setenv(decoded.SWITCH_ENV, "off")
    dataset = PACS(str(root), [0], AUGMENT)
    assert decoded.prepare(dataset).startswith("Decoded-image cache: off")
    assert not cache.exists() and dataset.datasets[0].decoded is None
    monkeypatch.setenv(decoded.SWITCH_ENV, "on")
    monkeypatch.setenv(decoded.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match="DG_PLUGINS_DECODED_BUDGET_GB='lots'"):
        decoded.prepare(dataset)


def prepare_tree(root) -> str:
    return decoded.prepare(PACS(str(root), [0], AUGMENT))


def test_jobs_started_together_build_the_files_once(tmp_path, cache):
    """Two processes (forked from this one, as two jobs) prepare the same tree at once: the
    folder's lock lets one build, the other reuses its files (whichever comes first)."""
    root = make_pacs_tree(tmp_path / "tree", per_class=3, size=96)
    children = [forked(prepare_tree, root) for _ in range(2)]
    results = [forked_result(pid, read) for pid, read in children]
    assert all(status == 0 for status, _ in results), results
    states = sorted(text.split("Decoded-image cache: ")[-1].split()[0] for _, text in results)
    assert states == ["built", "reused"], results


BUILDERS_AFTER_OPENMP = """
import torch
from dg_plugins.datasets import decoded

def probe(task):
    torch.ones(2 ** 22).add_(1)  # a parallel operation
    return torch.get_num_threads()

torch.set_num_threads(2)
torch.ones(2 ** 22).add_(1)  # the job's OpenMP threads run before the builders are forked
builders = decoded.Builders([], cores=2)
print(builders.map(probe, [(0,), (1,)]))
builders.close()
"""


def test_builders_forked_after_torch_ran_threads_run_one_thread_and_never_hang():
    """The cache's build processes are forked from a job that has run torch on several threads
    (OpenMP): each runs one torch thread, as a DataLoader worker does (before, a builder hung in
    its first parallel operation, and with it the job)."""
    proc = subprocess.Popen([sys.executable, "-c", BUILDERS_AFTER_OPENMP], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise AssertionError("a cache builder hung in a parallel torch operation") from None
    assert proc.returncode == 0 and out.strip().splitlines()[-1] == "[1, 1]", out


def _die(task):
    os._exit(3)


def test_a_build_process_that_dies_fails_the_build_not_the_job(tmp_path, cache, monkeypatch):
    """A builder killed mid-task (the OOM killer, a crashing codec): the build ends with the
    error named (never a wait for a result that cannot come) and the job reads its files."""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=32)
    monkeypatch.setattr(decoded, "_decode_into", _die)
    dataset = PACS(str(root), [0], AUGMENT)

    def hung(signum, frame):
        raise AssertionError("the build waited for a dead builder's result (a hang)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        line = decoded.prepare(dataset, cores=2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert "not used" in line and "a build process died" in line, line
    assert all(env.decoded is None for env in dataset.datasets)
    x, _ = dataset.datasets[1][0]
    assert x.shape == (3, 224, 224)


# ------------------------------------------------------------------------------------------------
# Batches from the cache against batches from the files


@contextlib.contextmanager
def whole_transforms(monkeypatch):
    """No transform splits: items are made whole by ``__getitem__`` (the path before the cache
    and the uint8 pixels)."""
    with monkeypatch.context() as patch:
        patch.setattr(decoded, "split_transform", lambda transform: None)
        yield


def splits_of(root, cache_on: bool):
    dataset = PACS(str(root), [0], AUGMENT)
    if cache_on:
        decoded.prepare(dataset)
    plain_out, plain_in = split_dataset(dataset.datasets[0], 5, seed=1)
    augmented_out, augmented_in = split_dataset(dataset.datasets[2], 4, seed=2)
    return [(plain_in, 11), (augmented_in, 12), (plain_out, 13), (augmented_out, 14)]


@pytest.mark.parametrize("workers", [0, 2])
def test_evaluation_batches_from_the_cache_equal_those_from_the_files(tmp_path, cache,
                                                                      monkeypatch, workers):
    """Plain and augmented splits, read in chunks that end inside batches: the first
    evaluation (making and keeping the augmented splits' pixels) and a later one (reading them)
    give exactly the batches the whole transforms make from the image files."""
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    monkeypatch.setattr(evaluate, "CHUNK_IMAGES", 5)

    def batches_of(datasets):
        return [(j, x, y) for j, x, y in evaluate.eval_batches_of(datasets, 3, workers)]

    with whole_transforms(monkeypatch):
        want = batches_of(splits_of(root, cache_on=False))
    assert not cache.exists()
    cached = splits_of(root, cache_on=True)
    first = batches_of(cached)
    stored = list(next(cache.iterdir()).glob("*.eval-*.npy"))
    assert len(stored) == 2  # the two augmented splits' evaluation pixels
    for got in (first, batches_of(cached), batches_of(splits_of(root, cache_on=True))):
        assert len(got) == len(want)
        for (j, x, y), (k, u, v) in zip(got, want):
            assert j == k and torch.equal(x, u) and torch.equal(y, v) and x.is_contiguous()


def test_an_evaluation_stopped_early_keeps_no_partial_pixels(tmp_path, cache):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    datasets = splits_of(root, cache_on=True)
    with contextlib.closing(evaluate.eval_batches_of(datasets, 3, 0)) as each:
        for _ in range(len(datasets[0][0]) // 3 + 2):  # into the first augmented split
            next(each)
    assert not [p for p in next(cache.iterdir()).iterdir() if ".eval-" in p.name]


@pytest.mark.parametrize("workers", [0, 2])
def test_training_batches_from_the_cache_equal_those_from_the_files(tmp_path, cache,
                                                                    monkeypatch, workers):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)

    def draws(cache_on: bool):
        dataset = PACS(str(root), [0], AUGMENT)
        if cache_on:
            decoded.prepare(dataset)
        streams = [batches.BatchStream(dataset.datasets[i], 4, seed=i) for i in (1, 2)]
        pooled = batches.PooledBatches([dataset.datasets[1], dataset.datasets[3]], 5, seed=7)
        got = []
        for group in (streams, [pooled]):
            batches.share_workers(group, workers)
            try:
                got += [next(s) for _ in range(3) for s in group]
            finally:
                for s in group:
                    s.close()
        return got

    with whole_transforms(monkeypatch):
        want = draws(cache_on=False)
    for got in (draws(cache_on=False), draws(cache_on=True)):
        flat_got = [t for item in got for t in (item if isinstance(item, list) else [item])]
        flat_want = [t for item in want for t in (item if isinstance(item, list) else [item])]
        for (x, y), (u, v) in zip(flat_got, flat_want):
            assert torch.equal(x, u) and torch.equal(y, v)


def test_augmented_evaluation_pixels_over_the_budget_are_not_kept(tmp_path, cache, monkeypatch,
                                                                   capsys):
    root = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    want = list(evaluate.eval_batches_of(splits_of(root, cache_on=True), 3, 0))
    for path in next(cache.iterdir()).glob("*.eval-*"):
        path.unlink()
    folder = next(cache.iterdir())
    used = sum(p.stat().st_size for p in folder.iterdir() if p.name != ".lock")
    monkeypatch.setenv(decoded.BUDGET_ENV, str((used + 100) / 2**30))
    capsys.readouterr()
    got = list(evaluate.eval_batches_of(splits_of(root, cache_on=True), 3, 0))
    assert all(torch.equal(x, u) for (_, x, _), (_, u, _) in zip(got, want))
    assert not list(folder.glob("*.eval-*"))
    notes = [line for line in capsys.readouterr().out.splitlines() if "not cached" in line]
    assert len(notes) == 1 and "augmented splits' evaluation pixels" in notes[0], notes
