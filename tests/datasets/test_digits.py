"""Digits (MNIST-10k -> SVHN, MNIST-M, SYN, USPS): every supported local layout, read from tiny
files written here, gives the pixel values and labels that were written, at 32x32 RGB in [0, 1];
a missing domain names the files it looked for."""

import gzip
import struct

import numpy as np
import pytest
import torch

import dg_plugins.datasets  # noqa: F401  (registers Digits)
from dg_plugins import catalog, hparams
from dg_plugins.datasets import digits
from dg_plugins.registry import DATASETS


def write_idx(path, array):
    dtype_code = {np.uint8: 0x08}[array.dtype.type]
    header = struct.pack(">BBBB", 0, 0, dtype_code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def svhn_like_mat(path, images_nhwc, labels):
    from scipy.io import savemat

    savemat(path, {"X": np.transpose(images_nhwc, (1, 2, 3, 0)), "y": labels.reshape(-1, 1)})


def write_all_released(root, rng):
    """One tiny file set in the released formats; returns what was written per domain."""
    written = {}
    base = root / "digits"
    (base / "mnist").mkdir(parents=True)
    mnist = rng.randint(0, 256, (12, 28, 28)).astype(np.uint8)
    mnist_y = rng.randint(0, 10, 12).astype(np.uint8)
    write_idx(base / "mnist" / "train-images-idx3-ubyte.gz", mnist)
    write_idx(base / "mnist" / "train-labels-idx1-ubyte.gz", mnist_y)
    written["mnist"] = (mnist, mnist_y)
    for domain, name in (("svhn", "test_32x32.mat"), ("syn", "synth_test_32x32.mat")):
        (base / domain).mkdir()
        x = rng.randint(0, 256, (5, 32, 32, 3)).astype(np.uint8)
        y = np.array([10, 1, 2, 3, 9], dtype=np.uint8)  # 10 is digit 0 (SVHN)
        svhn_like_mat(base / domain / name, x, y)
        written[domain] = (x, np.array([0, 1, 2, 3, 9]))
    from PIL import Image

    folder = base / "mnist_m" / "mnist_m_test"
    folder.mkdir(parents=True)
    mm = rng.randint(0, 256, (3, 32, 32, 3)).astype(np.uint8)
    lines = []
    for i, image in enumerate(mm):
        Image.fromarray(image).save(folder / f"{i:08d}.png")
        lines.append(f"{i:08d}.png {i + 4}")
    (base / "mnist_m" / "mnist_m_test_labels.txt").write_text("\n".join(lines) + "\n")
    written["mnist_m"] = (mm, np.array([4, 5, 6]))
    (base / "usps").mkdir()
    usps = rng.uniform(-1, 1, (4, 256))
    usps_y = np.array([0, 7, 8, 1])
    text = "\n".join(" ".join([f"{label:.4f}"] + [f"{v:.6f}" for v in row])
                     for label, row in zip(usps_y, usps))
    with gzip.open(base / "usps" / "zip.test.gz", "wt") as f:
        f.write(text + "\n")
    written["usps"] = (usps, usps_y)
    return written


def test_released_formats_give_the_written_pixels_and_labels(tmp_path):
    pytest.importorskip("scipy")
    written = write_all_released(tmp_path, np.random.RandomState(0))
    dataset = DATASETS.get("Digits")(str(tmp_path), [1, 2, 3, 4], {})
    assert dataset.input_shape == (3, 32, 32) and dataset.num_classes == 10
    assert [len(env) for env in dataset] == [12, 5, 3, 5, 4]
    for env, domain in zip(dataset, Digits_envs()):
        x, y = env.tensors
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32)
        assert x.min() >= 0 and x.max() <= 1
        assert y.tolist() == [int(v) for v in written[domain][1]]
    # 32x32 colour files keep their exact pixels (channel-first)
    for index, domain in ((1, "svhn"), (2, "mnist_m"), (3, "syn")):
        expected = torch.from_numpy(written[domain][0]).permute(0, 3, 1, 2).float() / 255
        torch.testing.assert_close(dataset[index].tensors[0], expected)
    # grey digits: three equal channels; MNIST 28 -> 32 and USPS 16 -> 32 by bilinear resizing
    mnist_x = dataset[0].tensors[0]
    assert torch.equal(mnist_x[:, 0], mnist_x[:, 1]) and torch.equal(mnist_x[:, 0], mnist_x[:, 2])
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(written["mnist"][0]).float()[:, None] / 255, size=(32, 32),
        mode="bilinear", align_corners=False, antialias=True)
    torch.testing.assert_close(mnist_x[:, :1], ref.clamp(0, 1))
    usps_mean = dataset[4].tensors[0].mean(dim=(1, 2, 3))
    torch.testing.assert_close(usps_mean, torch.tensor((written["usps"][0] + 1) / 2).float()
                               .mean(dim=1), atol=2e-3, rtol=0)


def Digits_envs():
    return DATASETS.get("Digits").ENVIRONMENTS


def test_mnist_source_is_the_first_10k_training_digits(tmp_path, monkeypatch):
    monkeypatch.setattr(digits, "MNIST_SOURCE_COUNT", 7)
    base = tmp_path / "digits"
    base.mkdir()
    x = np.arange(9 * 28 * 28, dtype=np.int64).reshape(9, 28, 28) % 256
    y = np.arange(9) % 10
    np.savez(base / "mnist.npz", x=x.astype(np.uint8), y=y)
    images, labels = digits.load_domain("mnist", str(tmp_path))
    assert labels.tolist() == list(range(7)) and len(images) == 7


def test_npz_and_image_folder_layouts(tmp_path):
    from PIL import Image

    base = tmp_path / "digits"
    base.mkdir()
    x = np.random.RandomState(1).rand(3, 32, 32).astype(np.float32)
    np.savez(base / "usps.npz", x=x, y=np.array([3, 4, 5]))
    images, labels = digits.load_domain("usps", str(tmp_path))
    assert labels.tolist() == [3, 4, 5]
    torch.testing.assert_close(images[:, 2], torch.from_numpy(x))
    for digit in (2, 7):
        (base / "svhn" / str(digit)).mkdir(parents=True)
        Image.fromarray(np.full((32, 32, 3), 10 * digit, np.uint8)).save(
            base / "svhn" / str(digit) / "a.png")
    images, labels = digits.load_domain("svhn", str(tmp_path))
    assert labels.tolist() == [2, 7]
    torch.testing.assert_close(images.mean(dim=(1, 2, 3)), torch.tensor([20 / 255, 70 / 255]))


def test_missing_domain_names_the_expected_files_and_how_to_get_them(tmp_path):
    """The downloader does not provide Digits, so the message says so and where to put the
    files; the mnist domain's message adds the downloader's MNIST command (its IDX files are one
    of that domain's layouts)."""
    (tmp_path / "digits").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        DATASETS.get("Digits")(str(tmp_path), [], {})
    message = str(err.value)
    assert "mnist.npz" in message and "train-images-idx3-ubyte" in message
    assert "never downloads" not in message
    assert ("The downloader (python -m dg_plugins.scripts.download) does not provide Digits: "
            "get the domain's files from their publishers and put one of these in place") \
        in message
    assert (f"`python -m dg_plugins.scripts.download --data_dir {tmp_path} MNIST` writes them "
            f"to {tmp_path / 'MNIST' / 'raw'}/") in message
    with pytest.raises(FileNotFoundError, match="test_32x32.mat") as err:
        digits.load_domain("svhn", str(tmp_path))
    assert "does not provide Digits" in str(err.value) and "MNIST" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="--data_dir"):
        DATASETS.get("Digits")(None, [], {})


def test_check_data_dir_finds_every_layout_without_reading_it(tmp_path):
    """The check sweep runs before launching: each domain in any of its layouts (empty files
    pass: nothing is read), an image folder only with an image in a digit folder; a missing domain
    gives the loader's message plus the other missing domains."""
    check = DATASETS.get("Digits").check_data_dir
    with pytest.raises(FileNotFoundError, match="--data_dir"):
        check(None)
    with pytest.raises(FileNotFoundError) as err:
        check(str(tmp_path))
    with pytest.raises(FileNotFoundError) as loaded:
        DATASETS.get("Digits")(str(tmp_path), [], {})
    assert str(err.value) == (str(loaded.value) + "\nAlso missing: 'svhn', 'mnist_m', 'syn', "
                              "'usps' (each in one of the same layouts, under its own name)")
    base = tmp_path / "digits"
    for path in ("MNIST/raw/train-images-idx3-ubyte.gz", "MNIST/raw/train-labels-idx1-ubyte",
                 "digits/svhn/test_32x32.mat", "digits/mnist_m/mnist_m_test_labels.txt",
                 "digits/syn.npz", "digits/usps/zip.test.gz"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"")
    check(str(tmp_path))
    (base / "usps" / "zip.test.gz").unlink()
    (base / "usps" / "7").mkdir()
    (base / "usps" / "7" / ".hidden").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="Digits domain 'usps' not found") as err:
        check(str(tmp_path))
    assert "Also missing" not in str(err.value)
    (base / "usps" / "7" / "a.png").write_bytes(b"")
    check(str(tmp_path))


def test_bad_files_raise_clear_errors(tmp_path):
    base = tmp_path / "digits"
    base.mkdir()
    np.savez(base / "usps.npz", images=np.zeros((2, 16, 16)))
    with pytest.raises(ValueError, match="'x'"):
        digits.load_domain("usps", str(tmp_path))
    np.savez(base / "usps.npz", x=np.zeros((2, 16, 16)), y=np.array([1, 12]))
    with pytest.raises(ValueError, match="0-9"):
        digits.load_domain("usps", str(tmp_path))


def test_default_backbone_is_lenet_and_catalog_knows_the_environments():
    assert catalog.DATASET_ENVIRONMENTS["Digits"] == ["mnist", "svhn", "mnist_m", "syn", "usps"]
    assert hparams.default_hparams("ERM", "Digits")["backbone"] == "lenet"
