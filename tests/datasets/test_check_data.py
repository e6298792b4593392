"""``python -m dg_plugins.scripts.check_data`` (issue 14 item 4): every unreadable image of a
dataset folder is listed before a long run. Real PACS images (the shared pacs_mini fixture),
copied and corrupted four ways."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dg_plugins.registry import DATASETS
from dg_plugins.scripts import check_data

PACS_MINI = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "pacs_mini"
pytestmark = pytest.mark.skipif(not (PACS_MINI / "PACS").is_dir(),
                                reason=f"shared fixture {PACS_MINI}/PACS is absent")
N_IMAGES = 40  # 30 JPEG + 10 PNG
ENV_FOLDERS = ["art_painting", "cartoon", "photo", "sketch"]


def corrupt_copy(tmp_path: Path, corrupt: bool = True) -> tuple[Path, list[str]]:
    """A writable copy of pacs_mini; with ``corrupt``, one image per environment broken: a
    truncated JPEG (A), garbage bytes (C), a zero-byte PNG (S), a dangling link (P). Returns the
    data_dir and the broken paths."""
    data_dir = tmp_path / "data"
    shutil.copytree(PACS_MINI, data_dir, copy_function=shutil.copyfile)
    for folder, _, _ in os.walk(data_dir):
        os.chmod(folder, 0o755)
    if not corrupt:
        return data_dir, []
    root = data_dir / "PACS"
    truncated = sorted((root / "art_painting").rglob("*.jpg"))[0]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    garbage = sorted((root / "cartoon").rglob("*.jpg"))[-1]
    garbage.write_bytes(np.random.RandomState(0).bytes(3000))
    empty = sorted((root / "sketch").rglob("*.png"))[0]
    empty.write_bytes(b"")
    link = sorted((root / "photo").rglob("*.jpg"))[0]
    link.unlink()
    link.symlink_to(link.parent / "gone.jpg")
    return data_dir, [str(truncated), str(garbage), str(link), str(empty)]


def unreadable_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("unreadable: ")]


def test_clean_dataset_exits_0(tmp_path, capsys):
    data_dir, _ = corrupt_copy(tmp_path, corrupt=False)
    assert check_data.main(["--dataset", "PACS", "--data_dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert f"All {N_IMAGES} images of PACS are readable" in out
    assert unreadable_lines(out) == []
    assert "  environment C (cartoon): 0 unreadable of 10" in out


@pytest.mark.parametrize("workers, pool", [(0, False), (2, True)])
def test_every_unreadable_image_is_listed(tmp_path, capsys, monkeypatch, workers, pool):
    """Truncated, garbage, zero-byte and dangling files are all found (decoding in this
    process, and in a pool of 2), each named with its error; a summary per environment;
    exit status 1."""
    if pool:
        monkeypatch.setattr(check_data, "MIN_FILES_FOR_POOL", 1)
    data_dir, broken = corrupt_copy(tmp_path)
    argv = ["--dataset", "PACS", "--data_dir", str(data_dir), "--workers", str(workers)]
    assert check_data.main(argv) == 1
    out = capsys.readouterr().out
    lines = unreadable_lines(out)
    assert [line.split(": ", 2)[1] for line in lines] == broken  # dataset order
    assert "OSError: image file is truncated" in lines[0]
    assert "UnidentifiedImageError: cannot identify image file" in lines[1]
    assert "FileNotFoundError" in lines[2]
    assert "UnidentifiedImageError" in lines[3]
    assert f"4 of {N_IMAGES} images unreadable:" in out
    for label, folder in zip("ACPS", ENV_FOLDERS):
        assert f"  environment {label} ({folder}): 1 unreadable of 10" in out
    assert "Remove or replace the 4 unreadable file(s)" in out


def test_command_line_generic_image_folder(tmp_path):
    """The real ``python -m`` entry on the generic ImageFolder (data_dir = the domain folders'
    parent; labels are the folder names), with the default worker count."""
    data_dir, broken = corrupt_copy(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "dg_plugins.scripts.check_data", "--dataset", "ImageFolder",
         "--data_dir", str(data_dir / "PACS")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert [line.split(": ", 2)[1] for line in unreadable_lines(proc.stdout)] == broken
    assert "  environment cartoon: 1 unreadable of 10" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_dataset_made_with_make_image_folder_dataset(tmp_path, capsys, monkeypatch):
    """A user's dataset registered by a plugin module named in $DG_PLUGINS_IMPORT."""
    data_dir, broken = corrupt_copy(tmp_path)
    (tmp_path / "my_check_plugin.py").write_text(textwrap.dedent("""
        from dg_plugins.datasets import make_image_folder_dataset
        MyPacs = make_image_folder_dataset("DgCheckMyPacs", "PACS", ["a", "c", "p", "s"])
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DG_PLUGINS_IMPORT", "my_check_plugin")
    try:
        assert check_data.main(["--dataset", "DgCheckMyPacs", "--data_dir", str(data_dir)]) == 1
    finally:
        DATASETS.unregister("DgCheckMyPacs")
        sys.modules.pop("my_check_plugin", None)
    out = capsys.readouterr().out
    assert [line.split(": ", 2)[1] for line in unreadable_lines(out)] == broken
    assert "  environment s (sketch): 1 unreadable of 10" in out


@pytest.mark.parametrize("dataset, data_dir, message", [
    ("NoSuchData", "data", r"unknown dataset 'NoSuchData'; image-folder datasets: .*PACS.*"
                           r"ImageFolder"),
    ("Debug28", "data", r"'Debug28' is not an image-folder dataset \(its data are in-memory "
                        r"tensors\), so there are no image files to check; image-folder "
                        r"datasets: .*PACS"),
    ("PACS", "missing", r"dataset folder .*missing/PACS does not exist\. PACS expects the layout"),
    ("VLCS", "data", r"VLCS does not exist.*Caltech101, LabelMe"),
])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, dataset, data_dir, message):
    corrupt_copy(tmp_path, corrupt=False)
    assert check_data.main(["--dataset", dataset, "--data_dir", str(tmp_path / data_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.out == ""
    assert re.search(message, captured.err), captured.err


def test_negative_workers_is_rejected(capsys):
    with pytest.raises(SystemExit) as info:
        check_data.main(["--dataset", "PACS", "--data_dir", ".", "--workers", "-1"])
    assert info.value.code == 2 and "--workers must be >= 0" in capsys.readouterr().err
