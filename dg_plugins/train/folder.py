"""The job-folder contract, shared by train (which writes a folder), sweep (which reads its state)
and collect_results (which reads its records): every file name of DomainBed's layout
(``domainbed/scripts/train.py``) and ours, whether a job is done, the exclusive lock of the one
process working in a folder, records appended durably and read back, the one-line errors of
a folder that cannot be written, and which accuracy keys of a record model selection reads
(:data:`SELECTION_READS`, the one declaration behind ``--eval_splits selection``). Torch-free."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os

from dg_plugins.files import DISK_FULL_ERRNOS, atomic_write_bytes

OUT_FILE = "out.txt"
ERR_FILE = "err.txt"
RESULTS_FILE = "results.jsonl"
MODEL_FILE = "model.pkl"
#: A model saved at a record's step (``--save_model_every_checkpoint``).
STEP_MODEL_FILE = "model_step{step}.pkl"
#: DomainBed's marker of a finished job, written last.
DONE_FILE = "done"
#: Ours: the resume file while the job runs (:mod:`dg_plugins.train.checkpoint`), and the lock.
CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = ".lock"
#: Files that only a job folder holds.
JOB_FILES = (RESULTS_FILE, DONE_FILE, OUT_FILE, ERR_FILE)
UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
#: Ours, a record key's part: a named subset (IP, OOP) of a test environment's out split cut down
#: to the items outside its in split, recorded as ``env{i}_out_<subset>_outside_in_{acc,count}``
#: only when the two splits share items (a predefined split: PACS's official target out split
#: lies inside its in split), so that pooling the two splits counts each image once.
OUTSIDE_IN_SUBSET = "{subset}_outside_in"


# --------------------------------------------------------------------------------------------------
# What model selection reads from a record, and hence what ``--eval_splits selection`` evaluates

#: ``--eval_splits`` values: ``all`` evaluates every split at every record (DomainBed's train.py);
#: ``selection`` only the splits that model selection reads (:func:`evaluated_splits`).
EVAL_SPLITS = ("all", "selection")
#: The default, DomainBed's behaviour. A record's ``args`` hold ``eval_splits`` only when it is
#: not this, so the args, commands and job-folder hashes of ``all`` stay DomainBed's.
DEFAULT_EVAL_SPLITS = "all"
#: The record key that lists the splits a ``selection`` record evaluated (``env0_out``, ...); a
#: record without it evaluated every split (DomainBed's records, ``--eval_splits all``).
EVALUATED_KEY = "evaluated_splits"

#: Which environments of a record a read names: its test environments (``args.test_envs``), the
#: others (its training environments), or every one.
TEST, TRAIN, ALL = "test", "train", "all"

#: The accuracy keys each model-selection method reads, per kind of record, as data: for each
#: split (``in``: ``env{i}_in_acc``, ``out``: ``env{i}_out_acc``, and the keys derived from a split,
#: e.g. the IP/OOP ``env{i}_in_ip_acc``), the environments whose key the method reads. Declared
#: once, here in the job-folder contract (record keys are part of it), because two sides use it:
#: collect's methods read every key through it (:mod:`dg_plugins.collect.selection`, ``.udg``,
#: ``.single_source``: a key outside a method's declaration reads as missing there), and train's
#: ``--eval_splits selection`` evaluates exactly the union of what the methods of the job's kind
#: read (:func:`evaluated_splits`). The tests drop every key outside a method's declaration
#: and check that its selection is unchanged, which keeps this table true.
#:
#: * ``domainbed`` (``domainbed/model_selection.py``): training-domain validation reads the
#:   training environments' out-splits and counts the environments by probing ``env{i}_out_acc``
#:   until one is missing (hence every out-split), and the test environment's in-split; the
#:   oracle reads the test environment's out- and in-split; leave-one-domain-out counts the
#:   environments on the out-splits too and reads the in-splits of the pair runs' test
#:   environments ``[t, j]`` (the held-out j) and of the single run's t.
#: * ``single_source`` (:mod:`dg_plugins.collect.single_source`): every out-split (the source's
#:   for training-domain validation and its table column, the targets' for the oracle, all of
#:   them to count the environments) and the targets' (test environments') in-splits.
#: * ``udg`` (:mod:`dg_plugins.collect.udg`): the same, several sources.
#:
#: No method reads a training environment's in-split (60-67% of a DomainBed job's images).
SELECTION_READS: dict[str, dict[str, dict[str, str]]] = {
    "domainbed": {
        "iid": {"out": ALL, "in": TEST},
        "oracle": {"out": TEST, "in": TEST},
        "loo": {"out": ALL, "in": TEST},
    },
    "single_source": {
        "iid": {"out": ALL, "in": TEST},
        "oracle": {"out": ALL, "in": TEST},
    },
    "udg": {
        "iid": {"out": ALL, "in": TEST},
        "oracle": {"out": ALL, "in": TEST},
    },
}


def single_source_of(test_envs, n_envs: int) -> int:
    """The one training environment of a single-source record (``test_envs`` leave exactly one
    of ``n_envs >= 3`` environments), or -1 for another kind of record. On a 3-environment dataset
    such a record is also a leave-one-domain-out pair run: it is of both kinds."""
    left = set(range(n_envs)) - set(test_envs)
    return left.pop() if n_envs >= 3 and len(test_envs) == n_envs - 1 and len(left) == 1 else -1


def record_kinds(test_envs, n_envs: int, udg: bool = False) -> tuple[str, ...]:
    """The kinds of :data:`SELECTION_READS` whose methods read a job's records: ``udg`` for a UDG
    job (``--label_fraction``; collect reads its records with the UDG selection only), else
    ``domainbed``, and ``single_source`` too when it has one training environment
    (:func:`single_source_of`)."""
    if udg:
        return ("udg",)
    return ("domainbed",) + (("single_source",) if single_source_of(test_envs, n_envs) >= 0
                             else ())


def read_environments(role: str, test_envs, n_envs: int) -> list[int]:
    """The environments a read of ``role`` (:data:`TEST`, :data:`TRAIN`, :data:`ALL`) names in a
    record of ``test_envs`` among ``n_envs``."""
    if role not in (TEST, TRAIN, ALL):
        raise ValueError(f"unknown read role {role!r}; expected one of {TEST, TRAIN, ALL}")
    tests = set(int(t) for t in test_envs)
    return [i for i in range(n_envs)
            if role == ALL or (i in tests) == (role == TEST)]


def evaluated_splits(eval_splits: str, test_envs, n_envs: int, uda: int = 0,
                     udg: bool = False) -> list[str]:
    """The splits a job evaluates at every record, named as DomainBed's train.py names them
    (``env{i}_in``, ``env{i}_out``, ``env{k}_uda``) and in its order (every in, every out, then
    the uda splits by position). ``uda``: how many uda splits the job has (non-empty ones of its
    test environments); ``udg``: a UDG job.

    ``all``: every split. ``selection``: the union, over the methods of every kind of the job's
    records (:func:`record_kinds`), of the keys they read (:data:`SELECTION_READS`): every
    out-split and the test environments' in-splits, so the training environments' in-splits are
    skipped; and the uda splits, which no method reads but which are a test environment's own
    data (DomainBed carves them out of its in-split) and cost at most ``uda_holdout_fraction`` of
    it. Torch-free: reproduce counts a job's evaluation cost with it before launching."""
    if eval_splits not in EVAL_SPLITS:
        raise ValueError(f"--eval_splits must be one of {', '.join(EVAL_SPLITS)}, got "
                         f"{eval_splits!r}")
    wanted: dict[str, set[int]] = {"in": set(), "out": set()}
    if eval_splits == "all":
        wanted = {split: set(range(n_envs)) for split in wanted}
    else:
        for kind in record_kinds(test_envs, n_envs, udg):
            for reads in SELECTION_READS[kind].values():
                for split, role in reads.items():
                    wanted[split].update(read_environments(role, test_envs, n_envs))
    names = [f"env{i}_{split}" for split in ("in", "out") for i in range(n_envs)
             if i in wanted[split]]
    return names + [f"env{k}_uda" for k in range(uda)]


def is_done(folder: str | None) -> bool:
    """Whether the job of ``folder`` finished (its ``done`` file exists)."""
    return bool(folder) and os.path.exists(os.path.join(folder, DONE_FILE))


def step_models(folder: str) -> list[str]:
    """The paths of the models saved at a record's step (:data:`STEP_MODEL_FILE`), sorted."""
    pattern = STEP_MODEL_FILE.format(step="*")
    return sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))


class JobStateError(ValueError):
    """The output folder's state does not allow the requested run (done, interrupted, busy, or
    inconsistent); the message says what to do."""



class FolderBusy(JobStateError):
    """Another live process holds the folder's lock (``holder``: its pid, or "unknown")."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


class OutputFolderError(ValueError):
    """The output folder cannot be created or written (permissions, a read-only file system);
    the message names the folder and the fix."""


class DiskFullError(OSError):
    """A write of the job failed for lack of space (:data:`DISK_FULL_ERRNOS`): reported as one
    line (exit status 1); everything written before is intact (atomic writes, records trimmed
    back), so the job continues with ``--resume`` once there is space."""

    def __str__(self) -> str:
        return str(self.strerror)


def _inside(path, folder: str) -> bool:
    if path is None:
        return False
    path, folder = os.path.abspath(str(path)), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def folder_error(folder: str, err: OSError, anywhere: bool = True) -> Exception | None:
    """The one-line error for an OSError met while writing job folder ``folder`` (a full disk,
    a folder this process may not write), or None for other errors (kept with their traceback).
    Without ``anywhere``, a permission error counts only when it names a file in ``folder`` (a
    data file the job may not read is another matter)."""
    if not anywhere and not _inside(err.filename, folder) and err.errno not in DISK_FULL_ERRNOS:
        return None
    if err.errno in DISK_FULL_ERRNOS:
        target = err.filename or folder
        return DiskFullError(
            err.errno,
            f"no space left on the device of {folder} while writing {target} ({err.strerror}); "
            "the job stopped, and what it wrote before is intact (its last checkpoint, the "
            "records that checkpoint counts, its model). Free space (or quota), then rerun the "
            "same command with --resume to continue from the last checkpoint")
    if err.errno in UNWRITABLE_ERRNOS:
        return unwritable_folder_error(folder, err)
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        return OutputFolderError(f"--output_dir {folder} cannot be a job folder: {err.strerror} "
                                 f"({err.filename}); choose another --output_dir")
    return None


@contextlib.contextmanager
def writing(folder: str):
    """Turn the OSErrors of writes into ``folder`` that the user can fix (a full disk, missing
    permissions) into their one-line errors (:func:`folder_error`)."""
    try:
        yield
    except OSError as err:
        translated = folder_error(folder, err) if not isinstance(
            err, (DiskFullError, OutputFolderError)) else None
        if translated is None:
            raise
        raise translated from err


def unwritable_folder_error(folder: str, err: OSError, flag: str = "--output_dir"
                            ) -> OutputFolderError:
    """The one-line error for an output folder this process may not write."""
    reason = err.strerror or str(err)
    return OutputFolderError(
        f"cannot write to the output folder {folder} ({reason}"
        + (f": {err.filename}" if err.filename and os.path.abspath(str(err.filename))
           != os.path.abspath(folder) else "")
        + f"); choose a writable {flag}, or give yourself write permission on it "
        f"(e.g. chmod u+w {folder})")


#: Tries, and seconds between them, before a held lock means "busy": a sweep that checks whether
#: a job is running (:func:`lock_holder`) holds a shared lock for an instant.
LOCK_TRIES = 5
LOCK_RETRY_S = 0.1


class FolderLock:
    """An exclusive ``flock`` on ``<output_dir>/.lock`` for the life of the job: a second train
    process on the same folder (or a ``--resume`` while the job still runs) fails at once with a
    clear message (:class:`FolderBusy`). The kernel releases the lock when the process dies,
    however it dies (a killed job leaves the empty lock file behind; it is reused)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, LOCK_FILE)
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no locking
            return self
        import time

        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError as err:
            raise unwritable_folder_error(os.path.dirname(self.path), err) from None
        for attempt in range(LOCK_TRIES):
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt + 1 < LOCK_TRIES:
                    time.sleep(LOCK_RETRY_S)
                    continue
                holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(self.fd)
                self.fd = None
                raise FolderBusy(
                    f"{os.path.dirname(self.path)} is in use by another train process (pid "
                    f"{holder}); wait for it to finish, or use another --output_dir",
                    holder) from None
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
    """Whether a live process holds ``folder``'s :class:`FolderLock`: its pid (as written in the
    lock file; "unknown" if unreadable), or None when none does. Looks with a shared lock taken
    and dropped at once (:class:`FolderLock` retries for that instant); creates nothing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking
        return None
    try:
        fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDONLY)
    except OSError:  # no lock file: nobody ever held it, or its holder ended cleanly
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def remove_temporary_files(folder: str) -> list[str]:
    """Delete the temp files (``.tmp-*``) that an atomic write interrupted by a kill leaves behind
    (a checkpoint's can be hundreds of MB). Only called while holding the folder lock."""
    removed = sorted(glob.glob(os.path.join(glob.escape(folder), ".tmp-*")))
    for path in removed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return removed


def format_row(cells, colwidth: int = 10, latex: bool = False) -> str:
    """One line as DomainBed's ``print_row`` prints it (``domainbed/lib/misc.py``), without the
    newline: floats with 10 decimals, every cell padded and truncated to ``colwidth``, joined by
    two spaces (text, then a trailing space) or `` & `` (LaTeX, then `` \\\\``). The rows of a
    job's out.txt, and of collect_results' text tables."""
    def cell(value) -> str:
        if isinstance(value, float) or getattr(getattr(value, "dtype", None), "kind", "") == "f":
            value = f"{value:.10f}"
        return str(value).ljust(colwidth)[:colwidth]

    return (" & " if latex else "  ").join(cell(v) for v in cells) + (" \\\\" if latex else " ")


def read_record_lines(path: str) -> list[bytes]:
    """The lines of ``results.jsonl`` (each with its newline; a torn last line without one is
    returned as it is)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def last_record(folder: str | None) -> dict | None:
    """The last record of ``folder``'s results.jsonl (None when there is none, or it cannot be
    read)."""
    if folder is None:
        return None
    try:
        lines = [line for line in read_record_lines(os.path.join(folder, RESULTS_FILE))
                 if line.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def append_record(path: str, record: dict) -> None:
    """Append one JSON line and fsync it, so that a checkpoint written afterwards never counts a
    record the disk does not hold. A failed write (a full disk) truncates the file back to its
    previous records, so no torn line is left, and raises with ``filename`` set to ``path``."""
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
