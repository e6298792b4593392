"""Image-folder datasets (``domainbed/datasets.py``) on the shared pacs_mini fixture and on small
trees written by the tests."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dg_plugins import catalog
from dg_plugins.datasets import image_folder
from dg_plugins.datasets.base import num_environments
from dg_plugins.datasets.image_folder import (
    PACS, ImageFolder, ImageFolderEnvironment, make_image_folder_dataset,
)
from dg_plugins.registry import DATASETS

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
PACS_MINI = FIXTURES / "pacs_mini"
needs_pacs_mini = pytest.mark.skipif(
    not (PACS_MINI / "PACS").is_dir(),
    reason=f"shared fixture {PACS_MINI}/PACS is absent (tests expect shared/ beside the repo)",
)
MEAN = torch.tensor(image_folder.IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(image_folder.IMAGENET_STD).view(3, 1, 1)


def make_tree(root, layout, size=(40, 30), mode="RGB"):
    """Write ``layout`` = {domain: {class: [file names]}} as small images under ``root``."""
    for domain, classes in layout.items():
        for class_name, files in classes.items():
            folder = root / domain / class_name
            folder.mkdir(parents=True, exist_ok=True)
            for index, name in enumerate(files):
                color = (index * 40) % 256 if mode == "L" else (200, 10 * index, 30)
                Image.new(mode, size, color=color).save(folder / name)
    return root


@pytest.fixture(scope="module")
def pacs_mini():
    if not (PACS_MINI / "PACS").is_dir():
        pytest.skip(f"shared fixture {PACS_MINI}/PACS is absent")
    return PACS(str(PACS_MINI), [0], {"data_augmentation": True})


# --- pacs_mini: environments, union class indices, transforms -------------------------------


@needs_pacs_mini
def test_pacs_environments_and_union_class_indices(pacs_mini):
    assert PACS.ENVIRONMENTS == ["A", "C", "P", "S"] == catalog.DATASET_ENVIRONMENTS["PACS"]
    assert pacs_mini.environment_folders == ["art_painting", "cartoon", "photo", "sketch"]
    assert len(pacs_mini) == 4 and pacs_mini.input_shape == (3, 224, 224)
    classes = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
    assert pacs_mini.classes == classes and pacs_mini.num_classes == 7
    missing = {"art_painting": "house", "cartoon": "guitar", "photo": "giraffe", "sketch": "person"}
    for folder, env in zip(pacs_mini.environment_folders, pacs_mini.datasets):
        assert isinstance(env, ImageFolderEnvironment) and env.classes == classes
        assert len(env) == 10 and env.targets == [label for _, label in env.samples]
        for path, label in env.samples:  # every label is the union index of its class folder
            assert Path(path).parent.name == classes[label]
            assert Path(path).parent.parent.name == folder
        present = {classes[label] for label in env.targets}
        assert present == set(classes) - {missing[folder]}
    person = classes.index("person")
    for env in pacs_mini.datasets[:3]:  # 'person' keeps index 6 although sketch lacks it
        assert person in env.targets
    assert person not in pacs_mini.datasets[3].targets


@needs_pacs_mini
def test_plain_transform_resizes_and_normalizes(pacs_mini):
    env = pacs_mini.datasets[0]  # test env: plain transform
    x, label = env[0]
    assert isinstance(label, int) and x.shape == (3, 224, 224) and x.dtype == torch.float32
    path = env.samples[0][0]
    with Image.open(path) as image:
        rgb = image.convert("RGB").resize((224, 224), Image.BILINEAR)
    pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1) / 255
    unnormalized = x * STD + MEAN
    assert unnormalized.min() >= -1e-5 and unnormalized.max() <= 1 + 1e-5
    # torchvision resizes with antialiasing, PIL's resize here without: close, not identical.
    assert (unnormalized - pixels).abs().mean() < 0.02
    assert torch.equal(env[0][0], x)  # deterministic


@needs_pacs_mini
def test_augmentation_only_on_training_environments(pacs_mini):
    assert pacs_mini.augmented_envs == [1, 2, 3]
    assert pacs_mini.datasets[0].transform is pacs_mini.plain_transform
    train_env = pacs_mini.datasets[1]
    assert train_env.transform is pacs_mini.augment_transform
    torch.manual_seed(0)
    first = train_env[0][0]
    torch.manual_seed(1)
    second = train_env[0][0]
    assert first.shape == (3, 224, 224) and not torch.equal(first, second)
    plain_view = train_env.with_transform(pacs_mini.plain_transform)
    assert plain_view.samples is train_env.samples
    assert train_env.transform is pacs_mini.augment_transform
    assert torch.equal(plain_view[0][0], plain_view[0][0])


@needs_pacs_mini
@pytest.mark.parametrize("hparams", [{"data_augmentation": False}, {}, None])
def test_no_augmentation_when_disabled(hparams):
    dataset = PACS(str(PACS_MINI), [], hparams)
    assert dataset.augmented_envs == [] and dataset.augment_transform is None
    assert all(env.transform is dataset.plain_transform for env in dataset.datasets)


@needs_pacs_mini
def test_generic_image_folder_discovers_environments():
    dataset = DATASETS.get("ImageFolder")(str(PACS_MINI / "PACS"), [], {})
    assert dataset.ENVIRONMENTS == ["art_painting", "cartoon", "photo", "sketch"]
    assert ImageFolder.ENVIRONMENTS is None and dataset.num_classes == 7
    with pytest.raises(ValueError, match="no fixed ENVIRONMENTS"):
        num_environments("ImageFolder")


# --- trees written by the tests -----------------------------------------------------------------


def test_union_classes_extensions_hidden_entries_and_grayscale(tmp_path):
    root = make_tree(tmp_path / "tree", {
        "d1": {"cat": ["a.jpg", "b.PNG"], "dog": ["c.JPEG"]},
        "d2": {"dog": ["d.bmp", "e.webp", "f.gif"], "zebra": ["g.png"]},
    })
    make_tree(root, {"d2": {"cat": ["h.png"]}}, mode="L")  # grayscale, converted to RGB
    (root / "d1" / "cat" / "notes.txt").write_text("not an image")
    (root / "d1" / "cat" / ".hidden.jpg").write_bytes(b"")  # macOS-style resource fork: skipped
    (root / ".cache" / "x").mkdir(parents=True)  # hidden folder: not an environment
    (root / "d1" / ".thumbs").mkdir()  # hidden class folder: not a class
    (root / "README.md").write_text("stray file: ignored")
    dataset = ImageFolder(str(root), [], None)
    assert dataset.ENVIRONMENTS == ["d1", "d2"]
    assert dataset.classes == ["cat", "dog", "zebra"] and dataset.num_classes == 3
    d1, d2 = dataset.datasets
    assert [(Path(p).name, label) for p, label in d1.samples] == [
        ("a.jpg", 0), ("b.PNG", 0), ("c.JPEG", 1)]
    assert [(Path(p).name, label) for p, label in d2.samples] == [
        ("h.png", 0), ("d.bmp", 1), ("e.webp", 1), ("f.gif", 1), ("g.png", 2)]
    for env in dataset.datasets:
        for index in range(len(env)):
            x, label = env[index]
            assert x.shape == (3, 224, 224) and label == env.samples[index][1]


def test_make_image_folder_dataset(tmp_path):
    make_tree(tmp_path / "my_data",
              {"b_dom": {"k": ["1.jpg"]}, "a_dom": {"k": ["2.jpg"], "j": ["3.jpg"]}})
    discovered = make_image_folder_dataset("MyTree", "my_data", data_dir=str(tmp_path),
                                           register=False)
    assert discovered.ENVIRONMENTS == ["a_dom", "b_dom"] and discovered.__module__ == __name__
    built = discovered(str(tmp_path), [1], {"data_augmentation": True})
    assert built.classes == ["j", "k"] and built.augmented_envs == [0]
    assert [len(env) for env in built.datasets] == [2, 1]
    # labels paired with folder names are put in sorted-folder order
    labelled = make_image_folder_dataset("MyTreeLabels", "my_data", ["B", "A"],
                                         env_folders=["b_dom", "a_dom"], checkpoint_freq=7,
                                         register=False)
    assert labelled.ENVIRONMENTS == ["A", "B"] and labelled.ENV_FOLDERS == ("a_dom", "b_dom")
    assert labelled.CHECKPOINT_FREQ == 7
    registered = make_image_folder_dataset("DgTestRegisteredTree", "my_data", ["A", "B"])
    try:
        assert DATASETS.get("DgTestRegisteredTree") is registered
        assert num_environments("DgTestRegisteredTree") == 2
        assert catalog.DATASET_ENVIRONMENTS["DgTestRegisteredTree"] == ["A", "B"]
    finally:
        DATASETS.unregister("DgTestRegisteredTree")
    with pytest.raises(ValueError, match="give environments"):
        make_image_folder_dataset("Nothing", "my_data", register=False)


def test_known_datasets_folders_and_settings():
    expected = {
        "VLCS": ("VLCS", 300), "PACS": ("PACS", 300), "OfficeHome": ("office_home", 300),
        "TerraIncognita": ("terra_incognita", 300), "DomainNet": ("domain_net", 1000),
    }
    for name, (folder, checkpoint_freq) in expected.items():
        cls = DATASETS.get(name)
        assert cls.FOLDER_NAME == folder and cls.CHECKPOINT_FREQ == checkpoint_freq
        assert cls.ENVIRONMENTS == catalog.DATASET_ENVIRONMENTS[name]
        assert len(cls.ENV_FOLDERS) == len(cls.ENVIRONMENTS)
        assert list(cls.ENV_FOLDERS) == sorted(cls.ENV_FOLDERS) and cls.INPUT_SHAPE == (3, 224, 224)


# --- clear errors ------------------------------------------------------------------------------

PACS_LAYOUT = os.path.join("<data_dir>", "PACS", "<domain>", "<class>", "<image>.jpg")


def test_missing_data_dir_and_dataset_folder(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        PACS(None, [], {})
    assert "--data_dir" in str(error.value) and PACS_LAYOUT in str(error.value)
    assert "art_painting, cartoon, photo, sketch" in str(error.value)
    with pytest.raises(FileNotFoundError) as error:
        PACS(str(tmp_path), [], {})
    assert str(tmp_path / "PACS") in str(error.value) and PACS_LAYOUT in str(error.value)


def test_bad_layouts_are_explained(tmp_path):
    (tmp_path / "PACS").mkdir()
    (tmp_path / "PACS" / "readme.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no domain folders") as error:
        PACS(str(tmp_path), [], {})
    assert PACS_LAYOUT in str(error.value)

    flat = tmp_path / "flat"  # images directly in the domain folders: no class level
    for domain in ("x", "y"):
        (flat / domain).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(flat / domain / "a.jpg")
    with pytest.raises(FileNotFoundError, match="no class folders") as error:
        ImageFolder(str(flat), [], {})
    assert str(flat / "x") in str(error.value)
    assert "<domain>/<class>" in str(error.value).replace(os.sep, "/")

    empty = tmp_path / "empty"
    (empty / "x" / "cat").mkdir(parents=True)
    (empty / "x" / "cat" / "a.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no image files") as error:
        ImageFolder(str(empty), [], {})
    assert str(empty / "x") in str(error.value) and ".jpg" in str(error.value)

    three = make_tree(tmp_path / "three" / "PACS", {d: {"dog": ["a.jpg"]} for d in ("a", "b", "c")})
    with pytest.raises(ValueError, match="has 3 domain folders") as error:
        PACS(str(three.parent), [], {})
    assert "4 environments" in str(error.value) and "art_painting" in str(error.value)


def test_nonstandard_domain_names_warn(tmp_path):
    make_tree(tmp_path / "PACS", {d: {"dog": ["a.jpg"]} for d in ("w", "x", "y", "z")})
    with pytest.warns(UserWarning, match="differ from the standard"):
        dataset = PACS(str(tmp_path), [], {})
    assert dataset.environment_folders == ["w", "x", "y", "z"]


def test_importing_datasets_loads_no_image_libraries():
    code = ("import sys, dg_plugins.datasets; print(sorted(m for m in "
            "('torchvision', 'PIL', 'timm', 'mlxtend') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


# --- corrupt images (issue 14 item 4) ----------------------------------------------------------


def writable_copy(source: Path, target: Path) -> Path:
    """Copy a (read-only) fixture tree and make the copy writable."""
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    for folder, _, _ in os.walk(target):
        os.chmod(folder, 0o755)
    return target


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_bytes(np.random.RandomState(0).bytes(4000))


def zero_bytes(path: Path) -> None:
    path.write_bytes(b"")


def dangling_link(path: Path) -> None:
    """Listed like an image, but cannot be opened (a link whose target is gone)."""
    path.unlink()
    path.symlink_to(path.parent / "moved_away.jpg")


CORRUPTIONS = {"truncated": truncate, "garbage": garbage, "zero_bytes": zero_bytes,
               "unreadable": dangling_link}


@needs_pacs_mini
@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=list(CORRUPTIONS))
def test_decode_errors_name_the_file_and_the_fix(tmp_path, corrupt):
    """Real PACS images corrupted four ways: the error names the file, the dataset, the
    environment, the decoder's error, and the fix (including the check command)."""
    data_dir = writable_copy(PACS_MINI, tmp_path / "data with space")
    env = PACS(str(data_dir), [], None).datasets[1]
    path, _ = env.samples[0]
    assert env[0][0].shape == (3, 224, 224)  # readable before
    corrupt(Path(path))
    with pytest.raises(OSError) as info:
        env[0]
    error = info.value
    assert isinstance(error, image_folder.UnreadableImageError) and isinstance(error, ValueError)
    message = str(error)
    assert message.startswith(f"cannot decode image file {path} (dataset PACS, "
                              "environment C (cartoon)): ")
    assert "Remove or replace this file" in message
    assert ("python -m dg_plugins.scripts.check_data --dataset PACS --data_dir "
            f"'{data_dir}'") in message
    assert error.path == path and error.__cause__ is not None
    assert type(error.__cause__).__name__ in message  # the decoder's own error is kept


@needs_pacs_mini
def test_truncated_images_fail_even_when_pil_is_told_to_load_them(tmp_path, monkeypatch):
    """DomainBed's datasets.py sets PIL's process-wide LOAD_TRUNCATED_IMAGES to True on import
    (the bridge imports it): a truncated image must still fail in our datasets, and the global
    flag is left as it was."""
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    data_dir = writable_copy(PACS_MINI, tmp_path / "data")
    env = PACS(str(data_dir), [], None).datasets[1]
    truncate(Path(env.samples[0][0]))
    with pytest.raises(image_folder.UnreadableImageError):
        env[0]
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True
    assert image_folder.image_error(env.samples[0][0]) is not None


def test_decode_error_in_a_dataloader_worker_names_the_file(tmp_path):
    """A truncated JPEG read by a DataLoader worker: the error re-raised in the main process
    is still an UnreadableImageError whose message is the clear one (no worker traceback in
    it), names the file and the worker."""
    root = make_tree(tmp_path / "tree", {"d1": {"cat": ["a.jpg", "b.jpg"]}, "d2": {"cat": ["c.jpg"]}},
                     size=(64, 64))
    dataset = ImageFolder(str(root), [], None)
    env = dataset.datasets[0]
    path = env.samples[1][0]
    truncate(Path(path))
    loader = torch.utils.data.DataLoader(env, batch_size=2, num_workers=1)
    with pytest.raises(image_folder.UnreadableImageError) as info:
        next(iter(loader))
    message = str(info.value)
    assert message.startswith(f"cannot decode image file {path} (dataset ImageFolder, "
                              "environment d1): ")
    assert "OSError: " in message and "Traceback" not in message
    assert message.endswith("(raised in DataLoader worker process 0)")
    assert "--dataset ImageFolder --data_dir " in message and info.value.path == path
    assert "Traceback" in info.value.worker_traceback


def test_image_error_reports_only_broken_files(tmp_path):
    root = make_tree(tmp_path, {"d": {"c": ["ok.jpg", "bad.jpg", "ok.png"]}})
    garbage(root / "d" / "c" / "bad.jpg")
    assert image_folder.image_error(str(root / "d" / "c" / "ok.jpg")) is None
    assert image_folder.image_error(str(root / "d" / "c" / "ok.png")) is None
    assert image_folder.image_error(str(root / "d" / "c" / "bad.jpg")).startswith(
        "UnidentifiedImageError: cannot identify image file")
