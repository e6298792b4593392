"""The decoded-image cache (exact): an image-folder dataset's images decoded once per machine into
memory-mapped uint8 files its jobs share (``decoded``), with the pixels evaluation reads (``plain``,
``eval``), named by a fingerprint of the images and decoders, checked by a ``.sum`` per entry, and
built by one job under an ``flock`` (docs/datasets.md). :class:`PixelTransform` splits a transform
into PIL operations and a finisher run on the job's device."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import json
import math
import multiprocessing
import os
import pathlib
import re
import shutil
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import torch

from dg_plugins.files import DISK_FULL_ERRNOS
from dg_plugins.runtime import pid_alive
from dg_plugins.signals import signal_name

#: Environment variables: the cache folder's base, the switch, the budget.
CACHE_ENV = "DG_PLUGINS_CACHE"
SWITCH_ENV = "DG_PLUGINS_DECODED_CACHE"
BUDGET_ENV = "DG_PLUGINS_DECODED_BUDGET_GB"
DEFAULT_BUDGET_GB = 20.0
_ROOM_FIX = f"to cache them free space there or set {CACHE_ENV} to a folder on a disk with room"
#: Free disk space the cache leaves (1 GiB, or a twentieth of a smaller disk) for the job's files.
DISK_RESERVE = 2**30
#: Bumped when the files' format or what they hold changes.
FORMAT_VERSION = 2
#: The build lock (its holder's ``pid host``), and the lock taken while a stale one is replaced.
LOCK_NAME = ".build.lock"
TAKEOVER_NAME = ".build.lock.takeover"
#: Seconds between two looks at a lock held by another job.
LOCK_POLL_S = 0.5
_OFF = ("0", "off", "false", "no")
#: torchvision transforms a pixel part may hold (PIL in, PIL RGB out), and the deterministic ones.
PIXEL_OPS = ("Resize", "CenterCrop", "RandomResizedCrop", "RandomCrop", "RandomHorizontalFlip",
             "RandomVerticalFlip", "ColorJitter", "RandomGrayscale")
DETERMINISTIC_OPS = ("Resize", "CenterCrop")


def cache_base() -> str:
    """``$DG_PLUGINS_CACHE``, else ``$XDG_CACHE_HOME/dg_plugins``, else ``~/.cache/dg_plugins``."""
    return os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dg_plugins")


def budget_bytes() -> int:
    """``$DG_PLUGINS_DECODED_BUDGET_GB`` (default 20) in bytes; ValueError for a bad value."""
    text = os.environ.get(BUDGET_ENV, "").strip() or str(DEFAULT_BUDGET_GB)
    value = -1.0
    with contextlib.suppress(ValueError):
        value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"${BUDGET_ENV}={text!r} is not a size in GB: set it to a finite number "
                         f">= 0 (e.g. {BUDGET_ENV}=50; 0 caches nothing) or unset it for "
                         f"{DEFAULT_BUDGET_GB:g}")
    return int(value * 2**30)


def gb(n: int) -> str:
    return f"{n / 2**30:.2f} GB"


def _digest(*parts) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()


def _prod(shape) -> int:
    return math.prod(int(v) for v in shape)


class TableFinisher:
    """ToTensor + Normalize as ``table`` (float32 ``[3, 256]``): uint8 pixels ``[N, 3, H, W]`` to
    the transform's output bit for bit. Only a ``seeded`` finisher reads the batch's ``seed``."""

    seeded = False

    def __init__(self, to_tensor, normalize):
        from PIL import Image

        ramp = np.repeat(np.arange(256, dtype=np.uint8).reshape(1, 256, 1), 3, axis=2)
        table = normalize(to_tensor(Image.fromarray(ramp, "RGB"))).reshape(3, 256)
        self.table = np.ascontiguousarray(table.numpy(), dtype=np.float32)
        self.key = self.table.tobytes().hex()

    def __call__(self, pixels, device, seed=None):
        return to_model_input(pixels, self.table, device)


class PixelTransform:
    """A transform split into ``ops`` (PIL operations, :data:`PIXEL_OPS`) and ``finisher``."""

    def __init__(self, ops, finisher):
        self.ops, self.finisher = list(ops), finisher
        self.deterministic = all(type(op).__name__ in DETERMINISTIC_OPS for op in self.ops)
        self.key = _digest([repr(op) for op in self.ops], finisher.key)[:16]

    @property
    def table(self):  # the exact finisher's (None for another finisher)
        return getattr(self.finisher, "table", None)

    def pixels(self, image):
        """uint8 ``[3, H, W]`` (a torch tensor) of ``image`` (RGB PIL) after the PIL ops."""
        for op in self.ops:
            image = op(image)
        if image.mode != "RGB":
            raise ValueError(f"the pixel part of a transform made a {image.mode} image, not RGB")
        return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)

    def image_shape(self) -> tuple | None:
        """``(3, H, W)`` of every output of a deterministic transform (checked on two sizes)."""
        from PIL import Image

        shapes = {tuple(self.pixels(Image.new("RGB", size)).shape) for size in ((301, 203),
                                                                               (97, 355))}
        return shapes.pop() if len(shapes) == 1 else None


def split_transform(transform) -> PixelTransform | None:
    """A Compose of :data:`PIXEL_OPS`, ToTensor, Normalize as a :class:`PixelTransform`."""
    if transform is None:
        return None
    from torchvision import transforms as T

    if type(transform) is not T.Compose or len(transform.transforms) < 2:
        return None
    *ops, to_tensor, normalize = transform.transforms
    if (type(to_tensor) is not T.ToTensor or type(normalize) is not T.Normalize
            or len(normalize.mean) != 3 or len(normalize.std) != 3
            or any(type(op) is not getattr(T, type(op).__name__, None)
                   or type(op).__name__ not in PIXEL_OPS for op in ops)):
        return None
    return PixelTransform(ops, TableFinisher(to_tensor, normalize))


_DEVICE_TABLES: dict = {}


def to_model_input(pixels, table, device):
    """uint8 ``[N, 3, H, W]`` pixels as float32 ``table[c, value]`` on ``device``."""
    device = torch.device(device)
    n, c, h, w = pixels.shape
    if device.type == "cpu":
        values = pixels.numpy()
        out = np.empty((n, c, h, w), dtype=np.float32)
        for i in range(n):
            for k in range(c):
                np.take(table[k], values[i, k], out=out[i, k], mode="clip")
        return torch.from_numpy(out)
    key = (id(table), str(device))
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES[key] = (table, torch.from_numpy(table).to(device))
    lookup = _DEVICE_TABLES[key][1]
    values = pixels.to(device, non_blocking=True)
    out = torch.empty((n, c, h, w), dtype=torch.float32, device=device)
    for k in range(c):
        out[:, k] = lookup[k][values[:, k].long()]
    return out


class DecodedImages:
    """A flat uint8 file and ``index`` (int64 ``[items, 3]``: offset (-1: left out), height,
    width), mapped when first read."""

    def __init__(self, path: str, index):
        self.path, self.index, self._data = path, index, None

    def __getstate__(self):
        return {"path": self.path, "index": self.index, "_data": None}

    def has(self, item: int) -> bool:
        return bool(self.index[item, 0] >= 0)

    def image(self, item: int):
        """The item's RGB image (of a view of the file), or None when left out."""
        from PIL import Image

        offset, height, width = (int(v) for v in self.index[item])
        if offset < 0:
            return None
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        return Image.fromarray(
            self._data[offset:offset + height * width * 3].reshape(height, width, 3), "RGB")


class PixelEntry:
    """uint8 pixels ``[items, 3, H, W]`` in a mapped ``.npy`` and ``ok`` (per item; None: all)."""

    def __init__(self, path: str, ok=None):
        self.path, self.ok, self._data = path, ok, None

    def __getstate__(self):
        return {"path": self.path, "ok": self.ok, "_data": None}

    def covers(self, rows) -> bool:
        return self.ok is None or bool(self.ok[rows].all())

    def read(self, rows):
        if self._data is None:
            self._data = np.load(self.path, mmap_mode="r")
        return np.array(self._data[rows])


def _remove(path: str) -> None:
    pathlib.Path(path).unlink(missing_ok=True)


def _disk_room(folder: str) -> int:
    """The free space on the disk of ``folder`` less :data:`DISK_RESERVE`."""
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize - min(DISK_RESERVE, stat.f_blocks * stat.f_frsize // 20)


def _new_file(path: str, shape: tuple | None, size: int = 0) -> int:
    """A new file, a uint8 ``.npy`` of ``shape`` or flat, given its bytes on the disk at once (a
    full disk fails before any work); returns where data starts."""
    header = io.BytesIO()
    if shape is not None:
        np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False,
                                                      "shape": tuple(int(v) for v in shape)})
        size = _prod(shape)
    total = max(len(header.getvalue()) + size, 1)
    with open(path, "wb") as handle:
        handle.write(header.getvalue())
        handle.flush()
        try:
            os.posix_fallocate(handle.fileno(), 0, total)
        except (AttributeError, OSError) as err:  # not on macOS, nor on some file systems
            if getattr(err, "errno", errno.ENOSYS) not in (errno.EINVAL, errno.EOPNOTSUPP,
                                                           errno.ENOSYS):
                raise
            if os.fstat(handle.fileno()).st_size < total:
                handle.truncate(total)
    return len(header.getvalue())


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()  # (hashlib.file_digest needs Python 3.11; we support 3.10)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**23), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: str) -> list[int]:
    """What changes when a file is written or replaced (a change time cannot be set back)."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]


def _seal(sum_path: str, paths: list[str], digests: dict) -> None:
    """Write an entry's ``.sum``: each file's :func:`_stamp` and SHA-256 (else read)."""
    files = {os.path.basename(p): {"stamp": _stamp(p),
                                   "sha256": digests.get(p) or _file_digest(p)} for p in paths}
    _save_bytes(sum_path, json.dumps({"format": FORMAT_VERSION, "files": files}).encode())


def _damage(sum_path: str, paths: list[str]) -> str | None:
    """None when an entry's files hold what was built (same stamp, else SHA-256), else why not."""
    try:
        files = json.loads(pathlib.Path(sum_path).read_bytes())["files"]
        recorded = [(list(files[os.path.basename(p)]["stamp"]),
                     str(files[os.path.basename(p)]["sha256"])) for p in paths]
    except FileNotFoundError:
        return f"{sum_path} is missing (the build of {paths[0]} did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{sum_path} is unreadable ({type(err).__name__}: {err})"
    renew = False
    for path, (built, sha256) in zip(paths, recorded):
        try:
            stamp = _stamp(path)
        except FileNotFoundError:
            return f"{path} is missing"
        if stamp == built:
            continue
        if stamp[0] != built[0]:
            return f"{path} has {stamp[0]} bytes, not the {built[0]} built"
        if _file_digest(path) != sha256:
            return f"{path} differs from what was built (its SHA-256)"
        renew = True
    if renew:  # copied, or touched: the same bytes
        with contextlib.suppress(OSError):
            _seal(sum_path, paths, {p: sha256 for p, (_, sha256) in zip(paths, recorded)})
    return None


def _save_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        pathlib.Path(tmp).write_bytes(data)
        os.replace(tmp, path)
    finally:
        _remove(tmp)


#: File descriptors of the build locks this process holds (a build process closes them).
_LOCK_FDS: set = set()


def _holder(fd: int) -> tuple[int, str] | None:
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
        pid, host = os.pread(fd, 512, 0).decode().split()
        return int(pid), host
    return None


def _inode(path: str) -> int | None:
    with contextlib.suppress(FileNotFoundError):
        return os.stat(path).st_ino
    return None


@contextlib.contextmanager
def _folder_lock(folder: str, check=lambda doing: None):
    """An ``flock`` on ``folder/.build.lock`` holding ``pid host``; held by another job, waits
    (``check(doing)`` between looks); one whose holder is gone (seen twice) is taken over."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path, host = os.path.join(folder, LOCK_NAME), socket.gethostname()
    waiting = f"waiting for another job's build of {folder}"
    said, stale = False, None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        with contextlib.ExitStack() as opened:  # fd closed unless it holds the lock
            opened.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder, inode = _holder(fd), os.fstat(fd).st_ino
            else:
                if os.fstat(fd).st_ino == _inode(path):  # not replaced by a take-over since opened
                    opened.pop_all()
                    break
                continue
        gone = holder is not None and holder[1] == host and not pid_alive(holder[0])
        if gone and stale == (holder, inode):  # the lock removed if still that file, under its own
            with open(os.path.join(folder, TAKEOVER_NAME), "a") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                if _inode(path) == inode:
                    os.remove(path)
                    print(f"Decoded-image cache: the job that was building {folder} (pid "
                          f"{holder[0]}) is gone but processes it started hold its lock; taking "
                          "the build over", flush=True)
            stale = None
            continue
        stale = (holder, inode) if gone else None
        if not said:
            who = f" (pid {holder[0]})" if holder else ""
            print(f"Decoded-image cache: another job{who} is building {folder}; waiting for it",
                  flush=True)
            said = True
        check(waiting)
        time.sleep(LOCK_POLL_S)
        check(waiting)
    with contextlib.suppress(OSError):  # a full disk: the lock holds, without its holder's pid
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {host}\n".encode(), 0)
    _LOCK_FDS.add(fd)
    try:
        yield
    finally:
        _LOCK_FDS.discard(fd)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the lock


def fingerprint(env) -> tuple[str, int]:
    """``(digest, bytes)`` of an environment's items (paths, labels, stats) and what decoding
    depends on besides them (PIL and its codecs, numpy, this format)."""
    import PIL
    from PIL import features

    codecs = []
    for name in ("jpg", "zlib", "libtiff", "webp"):
        with contextlib.suppress(Exception):
            codecs.append(f"{name}={features.version(name)}")
    digest = hashlib.sha256(f"v{FORMAT_VERSION} PIL={PIL.__version__} numpy={np.__version__} "
                            f"{' '.join(codecs)}".encode())
    parent = os.path.dirname(os.path.normpath(env.root))
    total = 0
    for path, label in env.samples:
        stat = os.stat(path)
        total += stat.st_size
        digest.update(f"{os.path.relpath(path, parent)}\t{label}\t{stat.st_size}\t"
                      f"{stat.st_mtime_ns}\t{stat.st_ctime_ns}\t{stat.st_ino}\n".encode())
    return digest.hexdigest()[:20], total


#: The dataset's environments while a cache is built (a builder inherits them when forked).
_BUILD_ENVS: list = []
#: prctl's option that sends a signal to the calling process when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


def _start_builder(envs, parent: int) -> None:
    """A build process: dies with its job, closes its copies of the build lock, leaves stop
    signals to the job, runs one torch thread (a fork after an OpenMP region hangs)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # not Linux
        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)
    for fd in list(_LOCK_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _BUILD_ENVS[:] = envs


class Builders:
    """A build's tasks in this process, or a pool of ``cores`` forked processes (one that dies
    fails the build: a ``multiprocessing.Pool`` would hang); ``check()`` between results."""

    def __init__(self, envs: list, cores: int, check=None):
        self.envs, self.cores, self.pool = list(envs), cores, None
        self.check = check or (lambda: None)

    def map(self, function, tasks: list) -> list:
        out = []
        if self.cores <= 1 or len(tasks) <= 1:
            _BUILD_ENVS[:] = self.envs
            try:
                for task in tasks:
                    self.check()
                    out.append(function(task))
            finally:
                _BUILD_ENVS.clear()
            return out
        self.pool = self.pool or ProcessPoolExecutor(
            self.cores, multiprocessing.get_context("fork"), initializer=_start_builder,
            initargs=(self.envs, os.getpid()))
        self.check()
        try:
            for result in self.pool.map(function, tasks):
                out.append(result)
                self.check()
        except BrokenProcessPool as err:
            raise OSError(f"a build process died ({err})") from err
        return out

    def chunks(self, function, env, items: list, *args) -> list:
        """``function((position of env, *args, chunk))`` over chunks of ``items``, concatenated."""
        position = next(k for k, e in enumerate(self.envs) if e is env)
        size = max(1, min(256, -(-len(items) // max(1, 4 * self.cores))))
        tasks = [(position, *args, items[k:k + size]) for k in range(0, len(items), size)]
        return [row for part in self.map(function, tasks) for row in part]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _header_sizes(task):
    """``[(item, height, width)]`` from the files' headers (0, 0 for an unreadable one)."""
    from PIL import Image

    position, items = task
    env, out = _BUILD_ENVS[position], []
    for item in items:
        try:
            with Image.open(env.samples[item][0]) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001  (left out: the normal path reports it)
            width = height = 0
        out.append((item, height, width))
    return out


def _decode_into(task):
    """Write ``[(item, offset, shape)]``'s pixels at their offsets of ``path``: the decoded file
    (``transform`` None), else the item's image after ``transform``; returns the items written."""
    position, path, transform, items = task
    env, done = _BUILD_ENVS[position], []
    with open(path, "r+b") as handle:
        for item, offset, shape in items:
            try:  # an unreadable image (an UnreadableImageError, an OSError) is left out
                image = env.load(env.samples[item][0]) if transform is None else env.image(item)
            except OSError:
                continue
            array = np.asarray(image) if transform is None else transform.pixels(image).numpy()
            if array.shape == tuple(shape):
                # written, not mapped: a full disk raises an OSError (through a map, a SIGBUS)
                view = memoryview(np.ascontiguousarray(array)).cast("B")
                while view:
                    written = os.pwrite(handle.fileno(), view, offset)
                    view, offset = view[written:], offset + written
                done.append(item)
    return done


class EnvCache:
    """One environment's files (``env.pixel_store``): ``decoded``, ``plain`` (by transform key)
    and its splits' evaluation pixels, each read only when intact (:func:`_damage`)."""

    def __init__(self, owner: "DatasetCache", env):
        self.owner, self.env = owner, env
        self.stem = _safe(os.path.basename(os.path.normpath(env.root)))
        self.digest, self.file_bytes = fingerprint(env)
        self.prefix = os.path.join(owner.folder, f"{self.stem}.{self.digest}")
        self.decoded: DecodedImages | None = None
        self.plain: dict[str, PixelEntry] = {}

    def __getstate__(self):  # what a loader worker needs: the files, not their builder
        return {**self.__dict__, "owner": None, "env": None}

    def paths(self, kind: str) -> tuple[str, str, str]:
        """An entry's data, side array and ``.sum`` files; ``kind``: decoded or plain-<key>."""
        data = self.prefix + (".decoded" if kind == "decoded" else f".{kind}.npy")
        side = self.prefix + (".decoded.index.npy" if kind == "decoded" else f".{kind}.ok.npy")
        return data, side, f"{self.prefix}.{kind}.sum"

    def eval_path(self, key: str) -> str:
        return self.prefix + f".eval-{key}.npy"

    def _open(self, kind: str):
        """``(data path, side array)`` of an intact entry, else None (a damaged one removed). Only
        under the build lock: a build has no files yet."""
        data, side, sum_path = self.paths(kind)
        if not any(os.path.exists(p) for p in (data, side, sum_path)):
            return None
        if (problem := _damage(sum_path, [data, side])) is None:
            return data, np.load(side)
        self.owner.discard([data, side], sum_path, problem)
        return None

    def open_decoded(self) -> bool:
        if self.decoded is None and (found := self._open("decoded")):
            self.decoded = DecodedImages(*found)
        return self.decoded is not None

    def open_plain(self, key: str) -> PixelEntry | None:
        if key not in self.plain and (found := self._open(f"plain-{key}")):
            self.plain[key] = PixelEntry(*found)
        return self.plain.get(key)

    def plain_entry(self, transform: PixelTransform) -> PixelEntry | None:
        return self.plain.get(transform.key)

    def eval_key(self, positions, transforms: list[PixelTransform], choice, batch_size: int,
                 seed: int) -> str:
        """The name of a split's evaluation pixels (files, items, transforms, batches, versions)."""
        import torchvision

        return _digest(self.digest, [t.key for t in transforms],
                       np.asarray(positions, dtype=np.int64).tobytes().hex(),
                       np.asarray(choice, dtype=np.uint8).tobytes().hex(), batch_size, seed,
                       torch.__version__, torchvision.__version__)[:24]

    def eval_entry(self, key: str) -> PixelEntry | None:
        """The split's intact evaluation pixels, else None; one without its ``.sum`` yet is left
        alone (another job may be writing it)."""
        sum_path = (path := self.eval_path(key)) + ".sum"
        if not (os.path.exists(path) and os.path.exists(sum_path)):
            return None
        if (problem := _damage(sum_path, [path])) is None:
            return PixelEntry(path)
        if self.owner is not None:
            self.owner.discard([path], sum_path, problem)
        return None

    def eval_writer(self, key: str, n: int) -> "EvalWriter | None":
        writable = self.owner is not None and self.owner.writable
        return EvalWriter(self, key, n) if writable else None


class EvalWriter:
    """A split's evaluation pixels written as its batches arrive (:meth:`add`), renamed in place
    with their ``.sum`` (:meth:`commit`); anything unexpected drops the file."""

    def __init__(self, store: EnvCache, key: str, n: int):
        self.store, self.n, self.path = store, n, store.eval_path(key)
        self.tmp = f"{self.path}.tmp.{os.getpid()}"
        # the file at the end of what was written, an item's shape, the file's SHA-256 so far
        self.handle = self.shape = self.digest = None
        self.filled, self.failed = 0, False

    def add(self, start: int, pixels) -> None:
        if self.failed:
            return
        owner = self.store.owner
        try:
            if self.handle is None:
                self.shape = tuple(pixels.shape[1:])
                size = self.n * _prod(self.shape)
                if size > owner.room():
                    owner.note_no_room("the augmented splits' evaluation pixels", size)
                    self.failed = True
                    return
                offset = _new_file(self.tmp, (self.n, *self.shape))
                self.handle = open(self.tmp, "r+b")
                self.digest = hashlib.sha256(self.handle.read(offset))
            if tuple(pixels.shape[1:]) != self.shape or start != self.filled:
                self.abort()
                return
            array = np.ascontiguousarray(pixels.numpy(), dtype=np.uint8)
            self.handle.write(array)
            self.digest.update(array)
            self.filled = start + len(array)
        except OSError as err:
            owner.note_error(err)
            self.abort()

    def commit(self) -> None:
        if self.failed or self.handle is None or self.filled != self.n:
            self.abort()
            return
        try:
            self.handle.close()
            self.handle = None
            os.replace(self.tmp, self.path)
            _seal(self.path + ".sum", [self.path], {self.path: self.digest.hexdigest()})
        except OSError as err:
            _remove(self.path)
            self.store.owner.note_error(err)
            self.abort()

    def abort(self) -> None:
        self.failed = True
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()
            self.handle = None
        _remove(self.tmp)


class DatasetCache:
    """The cache folder of one image-folder dataset; ``stop``, ``stopped``: see :func:`prepare`."""

    def __init__(self, dataset, stop=None, stopped=None):
        root = os.path.realpath(dataset.root)
        self.dataset, self.name = dataset, type(dataset).__name__
        self.folder = os.path.join(cache_base(), "decoded",
                                   f"{_safe(os.path.basename(root))}-{_digest(root)[:12]}")
        self.budget = budget_bytes()
        self.stop, self.stopped = stop, stopped
        self.writable = True
        self.notes = {}  # what was said, by key
        self.quiet = False  # notes are kept for the prepare line instead of printed

    def check(self, doing: str) -> None:
        """Raise ``stopped(signum, message)`` once ``stop`` (the job's StopRequest) has a signal."""
        if (signum := getattr(self.stop, "signum", None)) is not None and self.stopped is not None:
            raise self.stopped(signum, f"stopped by {signal_name(signum)} while {doing}, before "
                                       "training: rerun the same command to run the job")

    def usage(self) -> int:
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.folder):
                if entry.is_file() and not entry.name.startswith("."):
                    total += entry.stat().st_size
        return total

    def room(self) -> int:
        """Bytes the cache may add: within the budget, and leaving its disk some room."""
        try:
            disk = _disk_room(self.folder)
        except OSError:  # no folder (yet): its writes will say what is wrong
            disk = sys.maxsize
        return min(self.budget - self.usage(), disk)

    def _note(self, note: str, stream=None, key: str | None = None) -> None:
        key = key or note
        if key not in self.notes:
            self.notes[key] = note
            if not self.quiet:
                print(f"Decoded-image cache: {note}", file=stream or sys.stdout, flush=True)

    def note_no_room(self, what: str, size: int) -> None:
        """Say that ``what`` (``size`` bytes) is not cached, and how to cache it."""
        if (used := self.usage()) + size > self.budget:
            why = (f"over the {gb(self.budget)} budget; to cache them set {BUDGET_ENV}="
                   f"{max(1, -(-(used + size) // 2**30))}")
        else:
            why = (f"the disk of {self.folder} has {gb(shutil.disk_usage(self.folder).free)} free, "
                   f"and the cache leaves some free for the jobs' files; {_ROOM_FIX}")
        self._note(f"{what} of {self.name} ({gb(size)}) not cached: {why}", key=what)

    def note_error(self, err: OSError) -> None:
        """Say that a write failed; nothing is written after it."""
        self.writable = False
        if err.errno in DISK_FULL_ERRNOS:
            self._note(f"no space left on the disk of {self.folder} ({err.strerror}); going on "
                       f"without new cache files (images are read from their files); {_ROOM_FIX}",
                       sys.stderr, key="disk full")
            return
        self._note(f"could not write in {self.folder} ({err}); going on without new files",
                   sys.stderr)

    def discard(self, paths: list[str], sum_path: str, problem: str) -> None:
        """Remove a damaged entry's files (said once), else say how to clear the folder."""
        try:
            for path in (sum_path, *paths):
                _remove(path)
        except OSError as err:
            self._note(f"damaged: {problem}; not used (it could not be removed: {err}); "
                       f"delete {self.folder} and rerun", sys.stderr)
            return
        self._note(f"damaged: {problem}; removed, to be built again", sys.stderr)

    def _clean(self, stores: list[EnvCache]) -> None:
        """Remove files of older versions of these images, and temporary files of gone processes."""
        current = {store.stem: store.digest for store in stores}
        for entry in os.scandir(self.folder):
            parts = entry.name.split(".")
            if entry.name.startswith(".") or len(parts) < 3:
                continue
            stale = parts[0] in current and parts[1] != current[parts[0]]
            if parts[-2] == "tmp":
                with contextlib.suppress(ValueError):
                    stale = stale or not pid_alive(int(parts[-1]))
            if stale:
                _remove(entry.path)

    @staticmethod
    def _build(store: EnvCache, kind: str, builders: Builders, todo: list, transform=None,
               shape: tuple | None = None, size: int = 0, index=None) -> None:
        """Write entry ``kind``: ``todo``'s pixels (``[(item, offset past the header, shape)]``),
        its side array (``index``, its left-out items marked, else which items were written) and
        ``.sum``; on any failure none of its files is left."""
        data, side, sum_path = store.paths(kind)
        tmp = f"{data}.tmp.{os.getpid()}"
        try:
            start = _new_file(tmp, shape, size)
            ok = np.zeros(len(store.env.samples), dtype=bool)
            ok[builders.chunks(_decode_into, store.env, [(item, start + offset, item_shape)
                                                         for item, offset, item_shape in todo],
                               tmp, transform)] = True
            if index is not None:
                index[~ok, 0] = -1
            digest = _file_digest(tmp)
            os.replace(tmp, data)
            np.save(buffer := io.BytesIO(), ok if index is None else index)
            _save_bytes(side, buffer.getvalue())
            _seal(sum_path, [data, side], {data: digest})
        except BaseException:
            for path in (sum_path, data, side):
                _remove(path)
            raise
        finally:
            _remove(tmp)

    def _build_decoded(self, store: EnvCache, sizes: list[tuple[int, int, int]],
                       builders: Builders) -> None:
        index = np.full((len(store.env.samples), 3), -1, dtype=np.int64)
        offset, todo = 0, []
        for item, height, width in sizes:
            if height and width:
                index[item] = (offset, height, width)
                todo.append((item, offset, (height, width, 3)))
                offset += height * width * 3
        self._build(store, "decoded", builders, todo, size=offset, index=index)
        store.open_decoded()

    def prepare(self, cores: int = 1) -> str:
        """Build what is missing and fits, attach every file, and return the line train prints; a
        failed write is said in the line, a stop signal raises ``stopped``."""
        self.quiet = True
        built, stores = {}, []
        building = (f"building the decoded-image cache in {self.folder} (its unfinished files "
                    "removed)")
        builders = Builders(self.dataset.datasets, cores, check=lambda: self.check(building))
        try:
            self.check(f"preparing the decoded-image cache in {self.folder}")
            os.makedirs(self.folder, exist_ok=True)
            with _folder_lock(self.folder, self.check):
                stores = [EnvCache(self, env) for env in self.dataset.datasets]
                self._clean(stores)
                # (store, transform, shape) of deterministic evaluation transforms
                plain = [(s, t, t.image_shape()) for s in stores
                         for t in s.env.evaluation_pixel_transforms()]
                missing = [s for s in stores if not s.open_decoded()]
                missing_plain = [(s, t, shape) for s, t, shape in plain
                                 if shape is not None and s.open_plain(t.key) is None]
                plain_size = sum(len(s.env.samples) * _prod(shape)
                                 for s, _, shape in missing_plain)
                room = self.room()
                sizes, decoded_size = {}, sum(s.file_bytes for s in missing)
                if missing and plain_size + decoded_size <= room:  # else surely over
                    sizes = {s.stem: builders.chunks(_header_sizes, s.env,
                                                     list(range(len(s.env.samples))))
                             for s in missing}
                    decoded_size = sum(h * w * 3 for rows in sizes.values() for _, h, w in rows)
                if missing and plain_size + decoded_size <= room:
                    for store in missing:
                        self._build_decoded(store, sizes[store.stem], builders)
                        built["decoded images"] = True
                elif missing:
                    self.note_no_room("the decoded images" + " (at least)" * (not sizes),
                                      decoded_size)
                if missing_plain and plain_size <= self.room():
                    for store, transform, shape in missing_plain:
                        n = len(store.env.samples)
                        self._build(store, f"plain-{transform.key}", builders,
                                    [(item, item * _prod(shape), shape) for item in range(n)],
                                    transform, (n, *shape))
                        store.open_plain(transform.key)
                        built["evaluation pixels"] = True
                elif missing_plain:
                    self.note_no_room("the evaluation pixels", plain_size)
        except OSError as err:
            self.check(building)  # a build process ended by the stop signal (Slurm)
            self.note_error(err)
        finally:
            builders.close()
            self.quiet = False
        for store in stores:
            store.env.attach_cache(store)
        decoded = sum(s.decoded is not None for s in stores)
        plain = sum(bool(s.plain) for s in stores)
        state = (f"built ({' and '.join(built)})" if built else "reused" if decoded or plain
                 else "not used (images are decoded from their files as before)")
        notes = "".join(f"; {note}" for note in self.notes.values())
        return (f"Decoded-image cache: {state} for {self.name} ({decoded} of {len(stores)} "
                f"domains decoded, evaluation pixels of {plain}){notes}: {gb(self.usage())} on "
                f"disk in {self.folder}, read through the page cache (shared by this machine's "
                f"jobs); budget {gb(self.budget)} per dataset (${BUDGET_ENV}); off: "
                f"{SWITCH_ENV}=off; clear: rm -r {os.path.dirname(self.folder)}")


def _safe(name: str) -> str:
    """``name`` without dots (fields are split on them) and with a short hash of it."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[:40]}-{_digest(name)[:6]}"


def prepare(dataset, cores: int = 1, stop=None, stopped=None) -> str | None:
    """Build or reuse ``dataset``'s cache with ``cores`` processes, attach it, and return the line
    a job prints (None: not image folders). Once ``stop`` (the job's StopRequest) caught a
    signal, waiting or building raises ``stopped(signum, message)``."""
    if not hasattr(dataset, "datasets") or not all(
            hasattr(env, "attach_cache") for env in dataset.datasets) or not dataset.datasets:
        return None
    if os.environ.get(SWITCH_ENV, "").strip().lower() in _OFF:
        return (f"Decoded-image cache: off ({SWITCH_ENV}="
                f"{os.environ.get(SWITCH_ENV)}); images are decoded from their files")
    return DatasetCache(dataset, stop, stopped).prepare(cores)
