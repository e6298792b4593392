"""A launcher's claim on the job folders it queued: a ``flock``-held file per launcher under
``<sweep>/.launchers/``, under a sweep-wide lock; other launches and deletes leave them alone."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

#: The folder of a sweep that holds its claims and the lock that orders them.
CLAIMS_DIR, SWEEP_LOCK, CLAIM_SUFFIX = ".launchers", "lock", ".claim"

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no claims (as FolderLock: no locking)
    fcntl = None

_counter = itertools.count()


@dataclass
class Claim:
    """A live launcher's claim: who, and the job folders (names in the sweep folder) it holds."""

    pid: int
    host: str
    started: str
    command: str = ""
    jobs: list[str] = field(default_factory=list)
    path: str = ""

    def describe(self) -> str:
        """``launcher pid 123 on host1 (started 2025-01-02 12:03:04)``."""
        return f"launcher pid {self.pid} on {self.host} (started {self.started})"


def claims_dir(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, CLAIMS_DIR)


def sweep_dir_of(output_dir: str) -> str:
    """The sweep folder of a job folder (absolute)."""
    return os.path.dirname(os.path.abspath(output_dir))


@contextlib.contextmanager
def sweep_lock(sweep_dir: str, exclusive: bool) -> Iterator[bool]:
    """Hold the sweep-wide lock (exclusive to change claims); False when there is none to share."""
    if fcntl is None:
        yield True
        return
    folder = claims_dir(sweep_dir)
    path = os.path.join(folder, SWEEP_LOCK)
    while True:
        try:
            if exclusive:
                os.makedirs(folder, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            else:
                fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if exclusive:  # its folder was removed between the two calls: again
                continue
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(fd).st_ino:  # removed meanwhile by its holder
                continue
            yield True
            if exclusive and not any(n.endswith(CLAIM_SUFFIX) for n in os.listdir(folder)):
                with contextlib.suppress(OSError):  # still holding the lock
                    os.unlink(path)
                    os.rmdir(folder)
            return
        finally:
            os.close(fd)  # closing releases the lock


def _lock_is_held(path: str) -> bool | None:
    """Whether some process holds ``path``'s flock: True, False, or None when the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), or a file system without flock: count it live
        return True
    finally:
        os.close(fd)
    return False


def read_claims(sweep_dir: str, remove_stale: bool) -> list[Claim]:
    """The live claims in ``sweep_dir`` (stale ones removed when ``remove_stale``)."""
    folder = claims_dir(sweep_dir)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(CLAIM_SUFFIX))
    except OSError:
        return []
    live = []
    for name in names:
        path = os.path.join(folder, name)
        held = _lock_is_held(path)
        if held is None:
            continue
        if not held:  # its launcher has died: the kernel dropped its lock
            if remove_stale:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            continue
        try:
            with open(path) as f:
                data = json.load(f)
            live.append(Claim(int(data["pid"]), str(data["host"]), str(data["started"]),
                              str(data.get("command", "")),
                              [str(j) for j in data.get("jobs", [])], path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return live


def live_claims(sweep_dir: str) -> list[Claim]:
    """The claims of the live launchers on the sweep in ``sweep_dir`` (creates nothing)."""
    if fcntl is None or not os.path.isdir(claims_dir(sweep_dir)):
        return []
    with sweep_lock(sweep_dir, exclusive=False) as locked:
        return read_claims(sweep_dir, remove_stale=False) if locked else []


def held_folders(claims: Sequence[Claim], sweep_dir: str) -> dict[str, Claim]:
    """Absolute job folder -> the live claim that holds it."""
    return {os.path.abspath(os.path.join(sweep_dir, name)): claim
            for claim in claims for name in claim.jobs}


def held_in(sweep_dir: str) -> dict[str, Claim]:
    """:func:`held_folders` of the live claims in ``sweep_dir``."""
    return held_folders(live_claims(sweep_dir), sweep_dir)


#: Claims of this process that are open (a launcher releases a job's folder when the job ends).
_ACTIVE: list["LauncherClaim"] = []


class LauncherClaim:
    """This launcher's claim: :meth:`take` jobs nobody holds, :meth:`release` one that ended."""

    def __init__(self, sweep_dir: str, command: str = ""):
        self.sweep_dir = sweep_dir
        self.command = command
        self.fd: int | None = None
        self.path: str | None = None
        self.jobs: list[str] = []
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")

    def __enter__(self) -> "LauncherClaim":
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ValueError):
            _ACTIVE.remove(self)
        if self.fd is None:
            return
        with contextlib.suppress(OSError), sweep_lock(self.sweep_dir, exclusive=True):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None

    def take(self, jobs: Sequence, refresh: Callable[[object, dict], None],
             wanted: Callable[[object], bool], create: Callable[[object], None]
             ) -> tuple[list, list[Claim]]:
        """Claim the jobs still ``wanted``; returns (the jobs kept, the others' live claims)."""
        if fcntl is None:
            for job in jobs:
                create(job)
            return list(jobs), []
        with sweep_lock(self.sweep_dir, exclusive=True):
            others = read_claims(self.sweep_dir, remove_stale=True)
            held = held_folders(others, self.sweep_dir)
            for job in jobs:
                refresh(job, held)
            kept = [job for job in jobs if wanted(job)]
            try:
                for job in kept:
                    create(job)
                    self.jobs.append(os.path.basename(os.path.normpath(job.output_dir)))
            finally:
                if self.jobs:
                    self._write()
        return kept, others

    def release(self, folder: str) -> bool:
        """Stop holding ``folder`` (its job ended); False when this claim did not hold it."""
        name = os.path.basename(os.path.normpath(folder))
        if self.fd is None or name not in self.jobs:
            return False
        with sweep_lock(self.sweep_dir, exclusive=True):
            self.jobs.remove(name)
            self._write()
        return True

    def _write(self) -> None:
        """Write the claim, under the sweep lock (readers never see it half written)."""
        host = socket.gethostname() or "unknown-host"
        if self.fd is None:
            self.path = os.path.join(claims_dir(self.sweep_dir),
                                     f"{host}-{os.getpid()}-{next(_counter)}{CLAIM_SUFFIX}")
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        data = json.dumps({"pid": os.getpid(), "host": host, "started": self.started,
                           "command": self.command, "jobs": self.jobs}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)


def job_ended(folder: str | None) -> None:
    """A launcher's job ended: release its folder from this process's claim."""
    if folder is None:
        return
    for claim in list(_ACTIVE):
        with contextlib.suppress(OSError):
            if claim.release(folder):
                return
