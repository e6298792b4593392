"""A job's records (``results.jsonl``): appended durably, read back, trimmed on resume, and printed
as DomainBed's ``misc.print_row`` prints rows. Torch-free."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from dg_plugins.files import atomic_write_bytes
from dg_plugins.job.folder import RESULTS_FILE, JobStateError


def format_row(cells, colwidth: int = 10, latex: bool = False) -> str:
    """One row as DomainBed's ``misc.print_row`` prints it (or LaTeX's), without the newline."""
    def cell(value) -> str:
        if isinstance(value, float) or getattr(getattr(value, "dtype", None), "kind", "") == "f":
            value = f"{value:.10f}"
        return str(value).ljust(colwidth)[:colwidth]

    return (" & " if latex else "  ").join(cell(v) for v in cells) + (" \\\\" if latex else " ")


def read_record_lines(path: str) -> list[bytes]:
    """The lines of ``results.jsonl``, each with its newline (a torn last line without)."""
    return Path(path).read_bytes().splitlines(keepends=True) if os.path.exists(path) else []


def last_record(folder: str | None) -> dict | None:
    if folder is not None:
        with contextlib.suppress(OSError, ValueError):
            lines = [line for line in read_record_lines(os.path.join(folder, RESULTS_FILE))
                     if line.strip()]
            return json.loads(lines[-1]) if lines else None
    return None


def append_record(path: str, record: dict) -> None:
    """Append one JSON line and fsync it (a later checkpoint never counts a record not on disk);
    a failed write truncates the file back and raises with ``filename`` set."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            if err.filename is None:
                err.filename = path
            raise
    finally:
        os.close(fd)


def keep_counted_records(path: str, counted: int) -> None:
    """On resume: the first ``counted`` lines must be complete records; later ones are dropped."""
    lines = read_record_lines(path)
    complete = 0
    for line in lines[:counted]:
        if not line.endswith(b"\n"):
            break
        try:
            json.loads(line)
        except ValueError:
            break
        complete += 1
    if complete < counted:
        raise JobStateError(f"{path} holds {complete} complete records but the checkpoint counts "
                            f"{counted}: a record was lost or damaged (a crash or a full disk?), "
                            "so the job cannot continue consistently. Start it over with --force "
                            "(or move the folder away).")
    if len(lines) != counted:
        atomic_write_bytes(path, b"".join(lines[:counted]))
