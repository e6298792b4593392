"""A job's output folder (DomainBed's layout: ``out.txt``, ``err.txt``, ``results.jsonl``,
``model.pkl``, ``done``; ``domainbed/scripts/train.py``) and what keeps it consistent: the
exclusive lock of the one process working in it, the cleanup of interrupted atomic writes, and
records appended durably and trimmed to what a checkpoint counts."""

from __future__ import annotations

import contextlib
import glob
import json
import os

from dg_plugins.files import atomic_write_bytes

CHECKPOINT_FILE = "checkpoint.pt"
RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
LOCK_FILE = ".lock"


class JobStateError(ValueError):
    """The output folder's state does not allow the requested run (done, interrupted, busy, or
    inconsistent); the message says what to do."""



class FolderLock:
    """An exclusive ``flock`` on ``<output_dir>/.lock`` for the life of the job: a second train
    process on the same folder (or a ``--resume`` while the job still runs) fails at once with a
    clear message. The kernel releases the lock when the process dies, however it dies (a killed
    job leaves the empty lock file behind; it is reused)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, LOCK_FILE)
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no locking
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            raise JobStateError(
                f"{os.path.dirname(self.path)} is in use by another train process (pid {holder}); "
                "wait for it to finish, or use another --output_dir") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            # Unlink while still holding the lock, so the finished folder has DomainBed's exact
            # layout. Safe with non-blocking locks: a process that opened the old file meanwhile
            # fails (the job was still running); one that opens after gets a fresh file.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self.fd)  # closing releases the lock
            self.fd = None


def remove_temporary_files(folder: str) -> list[str]:
    """Delete the temp files (``.tmp-*``) that an atomic write interrupted by a kill leaves behind
    (a checkpoint's can be hundreds of MB). Only called while holding the folder lock."""
    removed = sorted(glob.glob(os.path.join(glob.escape(folder), ".tmp-*")))
    for path in removed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return removed


def read_record_lines(path: str) -> list[bytes]:
    """The lines of ``results.jsonl`` (each with its newline; a torn last line without one is
    returned as it is)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def append_record(path: str, record: dict) -> None:
    """Append one JSON line and fsync it, so that a checkpoint written afterwards never counts a
    record the disk does not hold."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def keep_counted_records(path: str, counted: int) -> None:
    """On resume: the first ``counted`` lines must be complete JSON records; later lines (written
    after the checkpoint, possibly torn) are dropped."""
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
        raise JobStateError(
            f"{path} holds {complete} complete records but the checkpoint counts {counted}: a "
            "record was lost or damaged (a crash or a full disk?), so the job cannot continue "
            "consistently. Start it over with --force (or move the folder away).")
    if len(lines) != counted:
        atomic_write_bytes(path, b"".join(lines[:counted]))
