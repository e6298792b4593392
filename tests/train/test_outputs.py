"""Output-folder helpers: atomic writes follow the umask like a plain ``open()`` (``done``,
``model.pkl`` and ``checkpoint.pt`` must not be created 0600, as ``mkstemp`` would make them)."""

import os
import stat

import pytest
import torch

from dg_plugins import files


@pytest.fixture
def umask():
    """Set the process umask for one test, restore it afterwards."""
    previous = os.umask(0o077)
    os.umask(previous)
    yield lambda value: os.umask(value)
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    with open(tmp_path / "plain", "w") as f:  # what a plain open() gives under this umask
        f.write("x")
    expected = mode(tmp_path / "plain")
    assert expected == 0o666 & ~mask
    files.atomic_write_bytes(str(tmp_path / "done"), b"done")
    files.atomic_torch_save({"w": torch.zeros(2)}, str(tmp_path / "model.pkl"))
    assert mode(tmp_path / "done") == expected
    assert mode(tmp_path / "model.pkl") == expected
    assert (tmp_path / "done").read_bytes() == b"done"
    assert torch.load(tmp_path / "model.pkl")["w"].shape == (2,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "model.pkl", "plain"]


def test_replacing_a_0600_file_heals_its_mode(tmp_path, umask):
    """A file left 0600 by an older version gets the umask's mode when it is rewritten (the
    write creates a new file and renames it over the old one)."""
    umask(0o022)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")
    path.chmod(0o600)
    files.atomic_write_bytes(str(path), b"new")
    assert path.read_bytes() == b"new" and mode(path) == 0o644


def test_failed_write_leaves_no_temp_file_and_keeps_the_old(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):  # not bytes: the write fails half-way
        files.atomic_write_bytes(str(path), object())
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]
