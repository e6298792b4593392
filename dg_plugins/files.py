"""Atomic file writes, the package's one implementation: a temporary file in the target's folder,
fsync, rename; a failed write leaves the old content and raises the OSError naming the file."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets

#: The errnos of a write that failed for lack of space (a full disk, or quota).
DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable as a plain ``open()``'s file would be."""
    folder = os.path.dirname(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        os.makedirs(folder, exist_ok=True)
        for _ in range(100):  # a new uniquely named file with open()'s mode, not mkstemp's 0600
            name = f".tmp-{secrets.token_hex(6)}-{os.path.basename(path)[-100:]}"
            tmp = os.path.join(folder, name)
            with contextlib.suppress(FileExistsError):
                fd = os.open(tmp, flags, 0o666)
                break
        else:
            raise FileExistsError(f"could not create a temporary file in {folder}")
    except OSError as err:
        _name(err, path)
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            _name(err, path)
        raise


def _name(err: OSError, path: str) -> None:
    """Make ``err`` name the file being written (a failed write or fsync names none)."""
    if err.filename is None or os.path.basename(str(err.filename)).startswith(".tmp-"):
        err.filename = path


def atomic_torch_save(obj, path: str) -> None:
    """``torch.save`` through :func:`atomic_write_bytes`."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def atomic_write_text(path: str, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))
