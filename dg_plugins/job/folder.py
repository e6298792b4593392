"""The job folder (DomainBed's layout, and ours): file names, whether it is done, the lock of the
one process working in it, and the one-line errors of a folder that cannot be written."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import time

from dg_plugins.files import DISK_FULL_ERRNOS

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None

OUT_FILE = "out.txt"
ERR_FILE = "err.txt"
RESULTS_FILE = "results.jsonl"
MODEL_FILE = "model.pkl"
STEP_MODEL_FILE = "model_step{step}.pkl"
#: DomainBed's marker of a finished job, written last.
DONE_FILE = "done"
#: Ours: the resume file while the job runs, and the lock.
CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = ".lock"
#: Files that only a job folder holds.
JOB_FILES = (RESULTS_FILE, DONE_FILE, OUT_FILE, ERR_FILE)
UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def is_done(folder: str | None) -> bool:
    return bool(folder) and os.path.exists(os.path.join(folder, DONE_FILE))


class JobStateError(ValueError):
    """The output folder's state does not allow the requested run; the message says what to do."""


class FolderBusy(JobStateError):
    """Another live process holds the folder's lock (``holder``: its pid, or "unknown")."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


class OutputFolderError(ValueError):
    """The output folder cannot be created or written; the message names the fix."""


class DiskFullError(OSError):
    """A write failed for lack of space: one line, exit status 1; what was written is intact."""

    def __str__(self) -> str:
        return str(self.strerror)


def folder_error(folder: str, err: OSError, anywhere: bool = True) -> Exception | None:
    """The one-line error for an OSError writing ``folder`` (a full disk, no permission), or None.
    Without ``anywhere``, a permission error counts only for a file in ``folder``."""
    if err.errno in DISK_FULL_ERRNOS:
        target = err.filename or folder
        return DiskFullError(err.errno, f"no space left on the device of {folder} while writing "
                             f"{target} ({err.strerror}); the job stopped, and what it wrote "
                             "before is intact (its last checkpoint, the records that checkpoint "
                             "counts, its model). Free space (or quota), then rerun the same "
                             "command with --resume to continue from the last checkpoint")
    root = os.path.abspath(folder)
    if not anywhere and (err.filename is None or os.path.commonpath(
            [os.path.abspath(str(err.filename)), root]) != root):
        return None
    if err.errno in UNWRITABLE_ERRNOS:
        return unwritable_folder_error(folder, err)
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        return OutputFolderError(f"--output_dir {folder} cannot be a job folder: {err.strerror} "
                                 f"({err.filename}); choose another --output_dir")
    return None


@contextlib.contextmanager
def writing(folder: str, anywhere: bool = True):
    """Turn the OSErrors of writes into ``folder`` into :func:`folder_error`'s errors."""
    try:
        yield
    except OSError as err:
        if (isinstance(err, DiskFullError)
                or (translated := folder_error(folder, err, anywhere)) is None):
            raise
        raise translated from err


def unwritable_folder_error(folder: str, err: OSError) -> OutputFolderError:
    named = err.filename and os.path.abspath(str(err.filename)) != os.path.abspath(folder)
    return OutputFolderError(
        f"cannot write to the output folder {folder} ({err.strerror or str(err)}"
        + (f": {err.filename}" if named else "") + "); choose a writable --output_dir, or give "
        f"yourself write permission on it (e.g. chmod u+w {folder})")


#: Tries, and seconds between them, before a held lock means "busy" (:func:`lock_holder` holds
#: a shared lock for an instant).
LOCK_TRIES = 5
LOCK_RETRY_S = 0.1


class FolderLock:
    """An exclusive ``flock`` on ``<output_dir>/.lock`` for the job's life: a second process fails
    at once (:class:`FolderBusy`). The kernel releases it however the process dies."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, LOCK_FILE)
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        if fcntl is None:  # pragma: no cover - not POSIX: no locking
            return self
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError as err:
            raise unwritable_folder_error(os.path.dirname(self.path), err) from None
        for attempt in range(LOCK_TRIES):
            if attempt:
                time.sleep(LOCK_RETRY_S)
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
        else:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            raise FolderBusy(f"{os.path.dirname(self.path)} is in use by another train process "
                             f"(pid {holder}); wait for it to finish, or use another --output_dir",
                             holder)
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


def lock_holder(folder: str) -> str | None:
    """The pid of the live process holding ``folder``'s :class:`FolderLock` ("unknown" if
    unreadable), or None; looks with a shared lock taken and dropped at once."""
    if fcntl is None:  # pragma: no cover - not POSIX: no locking
        return None
    try:
        fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDONLY)
    except OSError:  # no lock file: nobody ever held it, or its holder ended cleanly
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # taken: nobody holds it
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        pass
    finally:
        os.close(fd)  # also drops the shared lock
    return None


def remove_temporary_files(folder: str) -> list[str]:
    """Delete the ``.tmp-*`` files of atomic writes interrupted by a kill (under the lock)."""
    removed = sorted(glob.glob(os.path.join(glob.escape(folder), ".tmp-*")))
    for path in removed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return removed
