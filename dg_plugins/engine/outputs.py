"""Output-folder helpers shared by train and sweep: atomic writes, Tee, DomainBed's text rows."""

from __future__ import annotations

import os
import secrets

import numpy as np


def _create_temp_file(folder: str, suffix: str) -> tuple[int, str]:
    """Create a new, uniquely named file in ``folder``; return ``(fd, path)``.

    Unlike ``tempfile.mkstemp`` (always 0600), the file is created with mode 0666 filtered by the
    process umask (and the folder's default ACL, if any), exactly as ``open(path, "w")`` creates a
    new file: under umask 022 it is 0644, under 002 (shared group folders) 0664.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(folder, f".tmp-{secrets.token_hex(6)}-{suffix}")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {folder}")


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync and a rename, so that
    readers see the old or the new content, never a partial file.

    The file gets the permissions a plain ``open()`` would give a new file under the current
    umask (not mkstemp's 0600), so colleagues on a shared cluster can read ``model.pkl`` or see
    ``done``. A rewrite creates a new file, so its mode follows the umask too, whatever the mode
    of the file it replaces.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = _create_temp_file(folder, os.path.basename(path)[-100:])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_torch_save(obj, path: str) -> None:
    """``torch.save`` through :func:`atomic_write_bytes` (same atomicity and permissions)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


class Tee:
    """A stream that writes to ``stream`` and appends to ``path`` (DomainBed's out.txt/err.txt)."""

    def __init__(self, path: str, stream, mode: str = "a"):
        self.stream = stream
        self.file = open(path, mode)

    def write(self, message: str) -> int:
        self.stream.write(message)
        self.file.write(message)
        self.flush()
        return len(message)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        self.file.close()


def format_row(cells, colwidth: int = 10, latex: bool = False) -> str:
    """One line as DomainBed's ``print_row`` prints it (``domainbed/lib/misc.py``), without the newline: floats
    with 10 decimals, every cell padded and truncated to ``colwidth``, joined by two spaces (text,
    then a trailing space) or `` & `` (LaTeX, then `` \\\\``). Shared by train's progress rows
    and collect_results' tables."""
    def cell(value) -> str:
        if isinstance(value, (float, np.floating)):
            value = f"{value:.10f}"
        return str(value).ljust(colwidth)[:colwidth]

    return (" & " if latex else "  ").join(cell(v) for v in cells) + (" \\\\" if latex else " ")
