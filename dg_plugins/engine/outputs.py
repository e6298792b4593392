"""Output-folder helpers shared by train and sweep: Tee and DomainBed's text rows (atomic writes:
:mod:`dg_plugins.files`)."""

from __future__ import annotations

import numpy as np


class Tee:
    """A stream that writes to ``stream`` and appends to ``path`` (DomainBed's out.txt/err.txt;
    ``mode="w"`` starts the file over). When the file cannot be written any more (a full disk),
    the Tee keeps writing to ``stream`` and stops writing to the file (``file_error`` holds the
    error), so that the message saying what went wrong still reaches the user."""

    def __init__(self, path: str, stream, mode: str = "a"):
        self.stream = stream
        self.file = open(path, mode)
        self.file_error: OSError | None = None

    def write(self, message: str) -> int:
        self.stream.write(message)
        if self.file_error is None:
            try:
                self.file.write(message)
            except OSError as err:
                self.file_error = err
        self.flush()
        return len(message)

    def flush(self) -> None:
        self.stream.flush()
        if self.file_error is None:
            try:
                self.file.flush()
            except OSError as err:
                self.file_error = err

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:  # the unwritten tail of a full disk: already reported
            pass


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
