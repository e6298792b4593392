"""Output-folder helpers shared by train and sweep: atomic writes, Tee, DomainBed's text rows."""

from __future__ import annotations

import os
import tempfile

import numpy as np


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
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
    """One line as DomainBed's ``print_row`` prints it (spec 6.5), without the newline: floats
    with 10 decimals, every cell padded and truncated to ``colwidth``, joined by two spaces (text,
    then a trailing space) or `` & `` (LaTeX, then `` \\\\``). Shared by train's progress rows
    and collect_results' tables."""
    def cell(value) -> str:
        if isinstance(value, (float, np.floating)):
            value = f"{value:.10f}"
        return str(value).ljust(colwidth)[:colwidth]

    return (" & " if latex else "  ").join(cell(v) for v in cells) + (" \\\\" if latex else " ")
