"""The decoded-image cache (exact): every image of an image-folder dataset decoded once per
machine, as :meth:`~dg_plugins.datasets.image_folder.ImageFolderEnvironment.load` decodes it,
into memory-mapped uint8 files that the jobs of a sweep share; and the uint8 pixels evaluation
reads, so that no evaluation decodes or transforms an image twice:

* ``decoded``: each environment's RGB images, one flat file and an index (offset, height, width
  per item). An item PIL cannot decode is left out (its file is read, and its error raised, where
  it is read, as without the cache). Training rebuilds the PIL image (``Image.fromarray``: the
  same pixels) and augments it unchanged.
* ``plain``: a deterministic evaluation transform's pixels per item (the plain transform's
  224x224 resize), ``[items, 3, H, W]``.
* ``eval``: an augmented split's evaluation pixels, ``[items, 3, H, W]``, a function of the split's
  items, its batch partition and seeds (:func:`dg_plugins.train.evaluate.eval_seed`) and the
  transform: written by the first evaluation of the split, read by every later one (of this job
  and of the sweep's other jobs).

:class:`PixelTransform` splits a transform into its pixel part (PIL operations) and its tensor
part, a finisher run on the job's device: ToTensor + Normalize as a 256-entry table per channel
computed by them (:class:`TableFinisher`: the model's input is the transform's output bit for
bit), or with ``--augment_on device`` the seeded device augmentation
(:mod:`dg_plugins.datasets.device_augment`; its pixel part is the crop).

Files: ``$DG_PLUGINS_CACHE/decoded`` (default ``~/.cache/dg_plugins/decoded``), one folder per
dataset folder; an environment's files are named by a fingerprint of its file list (paths, sizes,
modification and change times, inodes) and the decoder's versions, so changed or replaced images
make new files (the old ones are removed). Each finished entry has a ``.sum`` file (each file's
size, inode, times and SHA-256, written when it was built): an entry whose files changed since is
checked against it and, when damaged (truncated, overwritten), removed and built again, so a
cache file is never read unless it holds what was built. ``DG_PLUGINS_DECODED_CACHE=off`` turns
the cache off; the dataset's files (its decoded images and plain pixels; its evaluation pixels
are skipped when they would not fit) stay within ``DG_PLUGINS_DECODED_BUDGET_GB`` (default 20)
and leave the disk some room (:data:`DISK_RESERVE`), else the job runs from the image files as
before. Files are allocated on the disk, then written with regular writes (they are only read
through memory maps): a full disk is an OSError that the job reports in one line, going on
without new files, never the SIGBUS of a write through a memory map.

Jobs on one machine build a folder's files once: an exclusive ``flock`` on ``.build.lock``,
which holds its holder's pid; the others wait, and stop at the first stop signal (a train job's
:class:`~dg_plugins.signals.StopRequest`). The build processes die with their job (Linux's
parent-death signal, else a watch of the parent) and do not hold the lock; a lock whose holder
is gone while processes it started still hold it is taken over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import signal
import socket
import sys
import time

from dg_plugins.files import DISK_FULL_ERRNOS
from dg_plugins.signals import signal_name

#: Environment variables: the cache folder's base, the switch, the budget.
CACHE_ENV = "DG_PLUGINS_CACHE"
SWITCH_ENV = "DG_PLUGINS_DECODED_CACHE"
BUDGET_ENV = "DG_PLUGINS_DECODED_BUDGET_GB"
DEFAULT_BUDGET_GB = 20.0
#: Free disk space the cache leaves (1 GiB, or a twentieth of a smaller disk): the job's own
#: records and checkpoints may be written to the same disk.
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


def cache_folder() -> str:
    """``$DG_PLUGINS_CACHE/decoded``, else ``$XDG_CACHE_HOME/dg_plugins/decoded``, else
    ``~/.cache/dg_plugins/decoded``."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dg_plugins")
    return os.path.join(base, "decoded")


def enabled() -> bool:
    """False when ``$DG_PLUGINS_DECODED_CACHE`` is off (0, off, false, no)."""
    return os.environ.get(SWITCH_ENV, "").strip().lower() not in _OFF


def budget_bytes() -> int:
    """``$DG_PLUGINS_DECODED_BUDGET_GB`` (default 20) in bytes; a bad value (not a finite number
    >= 0) raises ValueError naming it and the valid values."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return int(DEFAULT_BUDGET_GB * 2**30)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"${BUDGET_ENV}={text!r} is not a size in GB: set it to a finite number "
                         f">= 0 (e.g. {BUDGET_ENV}=50; 0 caches nothing) or unset it for "
                         f"{DEFAULT_BUDGET_GB:g}")
    return int(value * 2**30)


def gb(n: int) -> str:
    return f"{n / 2**30:.2f} GB"


def _digest(*parts) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------
# A transform's pixel part and tensor part


class TableFinisher:
    """The exact finisher: ToTensor + Normalize as ``table`` (float32 ``[3, 256]``, what they make
    of each channel value, computed by them), so that ``finisher(pixels, device)``
    (:func:`to_model_input`) is the transform's output bit for bit (both ops are elementwise).

    A finisher turns a batch of uint8 pixels ``[N, 3, H, W]`` (a pixel part's output, collated)
    into the model's float input on a device: ``finisher(pixels, device, seed)``; ``seed`` is the
    batch's seed, which only a ``seeded`` finisher reads (the device augmentation,
    :class:`dg_plugins.datasets.device_augment.DeviceFinisher`). ``key`` names what it computes."""

    seeded = False

    def __init__(self, to_tensor, normalize):
        import numpy as np
        from PIL import Image

        ramp = np.repeat(np.arange(256, dtype=np.uint8).reshape(1, 256, 1), 3, axis=2)
        table = normalize(to_tensor(Image.fromarray(ramp, "RGB"))).reshape(3, 256)
        self.table = np.ascontiguousarray(table.numpy(), dtype=np.float32)
        self.key = self.table.tobytes().hex()

    def __call__(self, pixels, device, seed=None):
        return to_model_input(pixels, self.table, device)


class PixelTransform:
    """A transform split in two: ``ops``, PIL operations (:data:`PIXEL_OPS`), which
    :meth:`pixels` runs (the same random draws as the whole transform) and returns as uint8
    ``[3, H, W]``; and ``finisher``, what turns a batch of those pixels into the model's input on
    the job's device (:class:`TableFinisher`: ToTensor + Normalize, exact). ``key`` names the
    operations' parameters and the finisher (the cache's files of pixels are named by it)."""

    def __init__(self, ops, finisher):
        self.ops = list(ops)
        self.finisher = finisher
        self.deterministic = all(type(op).__name__ in DETERMINISTIC_OPS for op in self.ops)
        self.key = _digest([repr(op) for op in self.ops], finisher.key)[:16]

    @property
    def table(self):
        """The exact finisher's table (None for another finisher)."""
        return getattr(self.finisher, "table", None)

    def pixels(self, image):
        """uint8 ``[3, H, W]`` (a torch tensor) of ``image`` (RGB PIL) after the PIL ops."""
        import numpy as np
        import torch

        for op in self.ops:
            image = op(image)
        if image.mode != "RGB":
            raise ValueError(f"the pixel part of a transform made a {image.mode} image, not RGB")
        return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)

    def image_shape(self) -> tuple | None:
        """``(3, H, W)`` of every output when the output size does not depend on the input
        (checked on two images of other sizes); None otherwise or for a random transform."""
        from PIL import Image

        if not self.deterministic:
            return None
        shapes = {tuple(self.pixels(Image.new("RGB", size)).shape) for size in ((301, 203),
                                                                               (97, 355))}
        return shapes.pop() if len(shapes) == 1 else None


def split_transform(transform) -> PixelTransform | None:
    """``transform`` as a :class:`PixelTransform`, or None when it is not a torchvision Compose
    of :data:`PIXEL_OPS` (Grayscale only with 3 output channels) then ToTensor and Normalize
    with 3 channels."""
    if transform is None:
        return None
    from torchvision import transforms as T

    if type(transform) is not T.Compose or len(transform.transforms) < 2:
        return None
    *ops, to_tensor, normalize = transform.transforms
    if type(to_tensor) is not T.ToTensor or type(normalize) is not T.Normalize:
        return None
    if len(normalize.mean) != 3 or len(normalize.std) != 3:
        return None
    if any(type(op) is not getattr(T, type(op).__name__, None)
           or type(op).__name__ not in PIXEL_OPS for op in ops):
        return None
    return PixelTransform(ops, TableFinisher(to_tensor, normalize))


_DEVICE_TABLES: dict = {}


def to_model_input(pixels, table, device):
    """uint8 ``[N, 3, H, W]`` pixels (a tensor, pinned for a CUDA device) as the model's float32
    input on ``device``: ``table[c, value]`` per element (:class:`PixelTransform`), a contiguous
    tensor. On a CPU a numpy lookup per image and channel; elsewhere a gather on the device."""
    import numpy as np
    import torch

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


# ------------------------------------------------------------------------------------------------
# The files


class DecodedImages:
    """One environment's decoded images: a flat uint8 file and ``index`` (int64 ``[items, 3]``:
    offset, height, width; offset -1 for an item left out). The file is mapped when first read,
    in each process (a pickled copy maps it again)."""

    def __init__(self, path: str, index):
        self.path = path
        self.index = index
        self._data = None

    def __getstate__(self):
        return {"path": self.path, "index": self.index, "_data": None}

    def __len__(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        return os.path.getsize(self.path)

    def has(self, item: int) -> bool:
        return bool(self.index[item, 0] >= 0)

    def array(self, item: int):
        """The item's ``[H, W, 3]`` uint8 pixels (a view of the file), or None when left out."""
        import numpy as np

        offset, height, width = (int(v) for v in self.index[item])
        if offset < 0:
            return None
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._data[offset:offset + height * width * 3].reshape(height, width, 3)

    def image(self, item: int):
        """The item's RGB PIL image (``Image.fromarray``: the decoded pixels), or None."""
        from PIL import Image

        array = self.array(item)
        return None if array is None else Image.fromarray(array, "RGB")


class PixelEntry:
    """uint8 pixels ``[items, 3, H, W]`` in a ``.npy`` file, mapped when first read, and ``ok``
    (a bool per item; None: all present)."""

    def __init__(self, path: str, ok=None):
        self.path = path
        self.ok = ok
        self._data = None

    def __getstate__(self):
        return {"path": self.path, "ok": self.ok, "_data": None}

    @property
    def data(self):
        import numpy as np

        if self._data is None:
            self._data = np.load(self.path, mmap_mode="r")
        return self._data

    def covers(self, rows) -> bool:
        return self.ok is None or bool(self.ok[rows].all())

    def read(self, rows):
        """The pixels of ``rows`` (a slice or an index array) as a new array."""
        import numpy as np

        return np.array(self.data[rows])


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


# ------------------------------------------------------------------------------------------------
# Disk space, and what a finished entry holds


def _free_bytes(folder: str) -> int:
    """Bytes a process may still write on the disk of ``folder``."""
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize


def _disk_room(folder: str) -> int:
    """What the cache may still write on the disk of ``folder``: its free space less
    :data:`DISK_RESERVE` (a twentieth of the disk's size on a disk under 20 GiB)."""
    stat = os.statvfs(folder)
    reserve = min(DISK_RESERVE, stat.f_blocks * stat.f_frsize // 20)
    return _free_bytes(folder) - reserve


def _allocate(path: str, size: int) -> None:
    """Give the file ``path`` ``size`` bytes (at least 1) on the disk at once
    (``posix_fallocate``), so that a full disk is found before any work, as an OSError (ENOSPC);
    where the system cannot, the file is only extended (the regular writes that fill it report
    a full disk as an OSError too: no file of the cache is written through a memory map)."""
    with open(path, "r+b") as handle:
        fallocate = getattr(os, "posix_fallocate", None)
        if fallocate is not None:
            try:
                fallocate(handle.fileno(), 0, max(size, 1))
                return
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
        if os.fstat(handle.fileno()).st_size < max(size, 1):
            handle.truncate(max(size, 1))


def _new_flat(path: str, size: int) -> None:
    """A new file of ``size`` bytes (at least 1) allocated on the disk (:func:`_allocate`)."""
    with open(path, "wb"):
        pass
    _allocate(path, size)


def _new_npy(path: str, shape: tuple) -> int:
    """A new uint8 ``.npy`` file of ``shape`` (its header written, its data zeros) allocated on
    the disk (:func:`_allocate`); returns where its data starts."""
    import io

    import numpy as np

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False,
                                                  "shape": tuple(int(v) for v in shape)})
    with open(path, "wb") as handle:
        handle.write(header.getvalue())
    _allocate(path, len(header.getvalue()) + _prod(shape))
    return len(header.getvalue())


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**23), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: str) -> list[int]:
    """What changes when a file is written, truncated or replaced: size, inode, modification
    and change times (a change time cannot be set back)."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]


def _seal(sum_path: str, paths: list[str], digests: dict | None = None) -> None:
    """Write the ``.sum`` file of a finished entry: each file's :func:`_stamp` and SHA-256
    (``digests`` by path, else read from the file)."""
    digests = digests or {}
    files = {os.path.basename(p): {"stamp": _stamp(p),
                                   "sha256": digests.get(p) or _file_digest(p)} for p in paths}
    _save_bytes(sum_path, json.dumps({"format": FORMAT_VERSION, "files": files}).encode())


def _damage(sum_path: str, paths: list[str]) -> str | None:
    """None when the files of an entry hold what was built (their ``.sum``: unchanged since,
    else the same size and SHA-256, the sum then renewed), else what is wrong with them."""
    try:
        with open(sum_path, "rb") as handle:
            files = json.loads(handle.read())["files"]
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


# ------------------------------------------------------------------------------------------------
# The build lock

#: File descriptors of the build locks this process holds (a build process closes them: the lock
#: is its job's alone).
_LOCK_FDS: set = set()


def _holder(fd: int) -> tuple[int, str] | None:
    """``(pid, host)`` written in a lock file by its holder, or None."""
    try:
        pid, host = os.pread(fd, 512, 0).decode().split()
        return int(pid), host
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _take_over(folder: str, path: str, inode: int) -> bool:
    """Remove the lock file ``path`` when it is still the file ``inode`` (not replaced by another
    job meanwhile: checked under a lock of its own); True when it was removed."""
    import fcntl

    guard = os.open(os.path.join(folder, TAKEOVER_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino != inode:
                return False
        except FileNotFoundError:
            return False
        os.remove(path)
        return True
    finally:
        os.close(guard)


@contextlib.contextmanager
def _folder_lock(folder: str, stop=None, stopped=None):
    """An exclusive ``flock`` on ``folder/.build.lock`` (none where fcntl is missing), holding
    this process's ``pid host``. Held by another job, it says so and waits, looking every
    :data:`LOCK_POLL_S` seconds: at ``stop`` (a :class:`~dg_plugins.signals.SignalCatcher` whose
    ``signum`` a stop signal sets) it raises ``stopped(signum, message)``; a lock whose holder is
    gone from this machine (seen twice) while other processes hold it (a killed job's build
    processes, started before they died with it) is taken over: its file is replaced."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = os.path.join(folder, LOCK_NAME)
    host = socket.gethostname()
    waiting = f"waiting for another job's build of {folder}"
    said, stale = False, None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, inode = _holder(fd), os.fstat(fd).st_ino
            os.close(fd)
        except BaseException:
            os.close(fd)
            raise
        else:
            if _same_file(fd, path):  # not replaced by a take-over since it was opened
                break
            os.close(fd)
            continue
        gone = holder is not None and holder[1] == host and not _pid_alive(holder[0])
        if gone and stale == (holder, inode):
            if _take_over(folder, path, inode):
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
        _check_stop(stop, stopped, waiting)
        time.sleep(LOCK_POLL_S)
        _check_stop(stop, stopped, waiting)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {host}\n".encode(), 0)
    except OSError:  # a full disk: the lock holds, without its holder's pid
        pass
    _LOCK_FDS.add(fd)
    try:
        yield
    finally:
        _LOCK_FDS.discard(fd)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the lock


def _check_stop(stop, stopped, doing: str) -> None:
    """Raise ``stopped(signum, message)`` when ``stop`` caught a stop signal (module
    docstring)."""
    signum = getattr(stop, "signum", None)
    if signum is None or stopped is None:
        return
    raise stopped(signum, f"stopped by {signal_name(signum)} while {doing}, before training: "
                          "rerun the same command to run the job")


def _versions() -> str:
    """What decoding depends on besides the files: PIL and its codecs, numpy, this format."""
    import numpy as np
    import PIL
    from PIL import features

    codecs = []
    for name in ("jpg", "zlib", "libtiff", "webp"):
        with contextlib.suppress(Exception):
            codecs.append(f"{name}={features.version(name)}")
    return f"v{FORMAT_VERSION} PIL={PIL.__version__} numpy={np.__version__} {' '.join(codecs)}"


def fingerprint(env) -> tuple[str, int]:
    """``(digest, bytes of the files)`` of an environment's items: their paths relative to the
    dataset folder, sizes, modification and change times and inodes (an image replaced or
    rewritten in place with its size and modification time kept still changes the last two), in
    item order, and :func:`_versions`."""
    digest = hashlib.sha256(_versions().encode())
    parent = os.path.dirname(os.path.normpath(env.root))
    total = 0
    for path, label in env.samples:
        stat = os.stat(path)
        total += stat.st_size
        digest.update(f"{os.path.relpath(path, parent)}\t{label}\t{stat.st_size}\t"
                      f"{stat.st_mtime_ns}\t{stat.st_ctime_ns}\t{stat.st_ino}\n".encode())
    return digest.hexdigest()[:20], total


# ------------------------------------------------------------------------------------------------
# Building (in a pool of the job's cores)

#: The dataset's environments while a cache is built (a builder inherits them when forked).
_BUILD_ENVS: list = []
#: prctl's option that sends a signal to the calling process when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """End this process when ``parent`` (the job) ends, however it ends (``kill -9``, the OOM
    killer): Linux's parent-death signal (SIGKILL), else a thread that watches the parent."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # not Linux
        import threading

        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)


def _start_builder(envs, parent: int) -> None:
    """A build process: dies with its job (:func:`_die_with`); does not hold the job's build lock
    (its copies of the lock's descriptors closed, so the lock ends with the job); the
    environments to read, the default signal dispositions (not the job's stop handlers, which
    would keep it alive when the pool ends it; Ctrl-C is the job's), and one torch thread, as a
    DataLoader worker has: a process forked after the job ran an OpenMP region would hang in its
    first parallel torch operation."""
    import torch

    _die_with(parent)
    for fd in list(_LOCK_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _BUILD_ENVS[:] = envs


class Builders:
    """Where a build's tasks run: in this process (``cores`` 1), or in one pool of ``cores``
    processes forked once per build (a ``concurrent.futures`` pool: a builder that dies fails
    the build with an error, where a ``multiprocessing.Pool`` would wait for its result forever).
    A task's first element is its environment's position in ``envs``. ``check`` (no arguments)
    runs between tasks' results: it raises to stop the build."""

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
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool
        import multiprocessing

        if self.pool is None:
            self.pool = ProcessPoolExecutor(self.cores, multiprocessing.get_context("fork"),
                                            initializer=_start_builder,
                                            initargs=(self.envs, os.getpid()))
        self.check()
        try:
            for result in self.pool.map(function, tasks):
                out.append(result)
                self.check()
        except BrokenProcessPool as err:
            raise OSError(f"a build process died ({err})") from err
        return out

    def position(self, env) -> int:
        return next(k for k, e in enumerate(self.envs) if e is env)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _header_sizes(items):
    """``[(item, height, width)]`` from the files' headers (0, 0 when PIL cannot open one)."""
    from PIL import Image

    position, items = items
    env, out = _BUILD_ENVS[position], []
    for item in items:
        try:
            with Image.open(env.samples[item][0]) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001  (left out: the normal path reports it)
            width = height = 0
        out.append((item, height, width))
    return out


def _write_at(fd: int, array, offset: int) -> None:
    """Write ``array``'s bytes at ``offset`` of the file ``fd`` with regular writes (a full disk
    is an OSError, where a write through a memory map would be a SIGBUS)."""
    import numpy as np

    view = memoryview(np.ascontiguousarray(array)).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _decode_into(task):
    """Decode ``items`` (``[(item, offset, height, width)]``) into the flat file ``path``;
    returns the items left out (unreadable, or another size than their header's)."""
    import numpy as np

    position, path, items = task
    env = _BUILD_ENVS[position]
    missing = []
    with open(path, "r+b") as handle:
        for item, offset, height, width in items:
            try:  # load() raises every decoding error as an UnreadableImageError, an OSError
                array = np.asarray(env.load(env.samples[item][0]))
            except OSError:
                missing.append(item)
                continue
            if array.shape != (height, width, 3):
                missing.append(item)
                continue
            _write_at(handle.fileno(), array, offset)
    return missing


def _pixels_into(task):
    """Write the pixels of ``items`` after ``transform`` into the ``.npy`` file ``path`` (its
    data at ``start``, ``shape`` per item); returns the items written."""
    position, path, start, shape, transform, items = task
    env = _BUILD_ENVS[position]
    done = []
    with open(path, "r+b") as handle:
        for item in items:
            try:  # an unreadable image (an UnreadableImageError) is left out
                image = env.image(item)
            except OSError:
                continue
            pixels = transform.pixels(image)
            if tuple(pixels.shape) != tuple(shape):
                continue
            _write_at(handle.fileno(), pixels.numpy(), start + item * _prod(shape))
            done.append(item)
    return done


def _chunks(items: list, cores: int) -> list[list]:
    size = max(1, min(256, -(-len(items) // max(1, 4 * cores))))
    return [items[k:k + size] for k in range(0, len(items), size)]


# ------------------------------------------------------------------------------------------------
# One dataset folder


class EnvCache:
    """One environment's files (``env.pixel_store``): its decoded images (``decoded``, None when
    not cached), its deterministic transforms' pixels (``plain`` by transform key) and its
    splits' evaluation pixels (:meth:`eval_entry`, :meth:`eval_writer`). An entry is read only
    when its files hold what was built (:func:`_damage`); a damaged one is removed."""

    def __init__(self, owner: "DatasetCache", env):
        self.owner = owner
        self.env = env
        self.stem = _safe(os.path.basename(os.path.normpath(env.root)))
        self.digest, self.file_bytes = fingerprint(env)
        self.prefix = os.path.join(owner.folder, f"{self.stem}.{self.digest}")
        self.decoded: DecodedImages | None = None
        self.plain: dict[str, PixelEntry] = {}

    def __getstate__(self):  # what a loader worker needs: the files, not their builder
        return {**self.__dict__, "owner": None, "env": None}

    # paths: an entry's files, then its .sum
    def decoded_paths(self) -> tuple[str, str]:
        return self.prefix + ".decoded", self.prefix + ".decoded.index.npy"

    def decoded_sum(self) -> str:
        return self.prefix + ".decoded.sum"

    def plain_paths(self, key: str) -> tuple[str, str]:
        return self.prefix + f".plain-{key}.npy", self.prefix + f".plain-{key}.ok.npy"

    def plain_sum(self, key: str) -> str:
        return self.prefix + f".plain-{key}.sum"

    def eval_path(self, key: str) -> str:
        return self.prefix + f".eval-{key}.npy"

    def eval_sum(self, key: str) -> str:
        return self.eval_path(key) + ".sum"

    # reading
    def _intact(self, paths, sum_path: str) -> bool:
        """Whether the entry holds what was built; one with files that does not is removed
        (and said). Only under the build lock: a build in progress has no files yet."""
        if not any(os.path.exists(p) for p in (*paths, sum_path)):
            return False
        problem = _damage(sum_path, list(paths))
        if problem is not None:
            self.owner.discard(list(paths), sum_path, problem)
        return problem is None

    def open_decoded(self) -> bool:
        import numpy as np

        data, index = self.decoded_paths()
        if self.decoded is None and self._intact((data, index), self.decoded_sum()):
            self.decoded = DecodedImages(data, np.load(index))
        return self.decoded is not None

    def open_plain(self, key: str) -> PixelEntry | None:
        import numpy as np

        data, ok = self.plain_paths(key)
        if key not in self.plain and self._intact((data, ok), self.plain_sum(key)):
            self.plain[key] = PixelEntry(data, np.load(ok))
        return self.plain.get(key)

    def plain_entry(self, transform: PixelTransform) -> PixelEntry | None:
        return self.plain.get(transform.key)

    def eval_key(self, positions, transforms: list[PixelTransform], choice, batch_size: int,
                 seed: int) -> str:
        """The name of a split's evaluation pixels: this environment's files, the split's items
        (``positions``) and which of ``transforms`` each takes (``choice``), the batch size, the
        seed, and the versions of what draws and transforms."""
        import numpy as np
        import torch
        import torchvision

        return _digest(self.digest, [t.key for t in transforms],
                       np.asarray(positions, dtype=np.int64).tobytes().hex(),
                       np.asarray(choice, dtype=np.uint8).tobytes().hex(), batch_size, seed,
                       torch.__version__, torchvision.__version__)[:24]

    def eval_entry(self, key: str) -> PixelEntry | None:
        """The split's evaluation pixels when a job kept them and they are intact; a damaged
        file is removed (written again by this evaluation). One without its ``.sum`` yet is
        left alone (another job may be putting it in place)."""
        path, sum_path = self.eval_path(key), self.eval_sum(key)
        if not os.path.exists(path) or not os.path.exists(sum_path):
            return None
        problem = _damage(sum_path, [path])
        if problem is None:
            return PixelEntry(path)
        if self.owner is not None:
            self.owner.discard([path], sum_path, problem)
        return None

    def eval_writer(self, key: str, n: int) -> "EvalWriter | None":
        if self.owner is None or not self.owner.writable:
            return None
        return EvalWriter(self, key, n)


class EvalWriter:
    """Writes a split's evaluation pixels as its batches arrive (:meth:`add`, regular writes in
    order), in a file allocated on the disk first, then puts the file in place with its ``.sum``
    (:meth:`commit`; a rename: readers see the whole file or none). A batch of another shape
    than the first, a budget or disk that the file would exceed, or a write error (a full disk)
    drops the file (the evaluation goes on)."""

    def __init__(self, store: EnvCache, key: str, n: int):
        self.store, self.n = store, n
        self.path, self.sum_path = store.eval_path(key), store.eval_sum(key)
        self.tmp = f"{self.path}.tmp.{os.getpid()}"
        self.handle = None  # the file, at the end of what was written
        self.shape = None  # of an item
        self.digest = None  # the file's SHA-256 so far (header, then the batches in order)
        self.filled = 0
        self.failed = False

    def add(self, start: int, pixels) -> None:
        if self.failed:
            return
        import numpy as np

        owner = self.store.owner
        try:
            if self.handle is None:
                self.shape = tuple(pixels.shape[1:])
                size = self.n * _prod(self.shape)
                if not owner.fits(size):
                    owner.note_no_room("the augmented splits' evaluation pixels", size)
                    self.failed = True
                    return
                offset = _new_npy(self.tmp, (self.n, *self.shape))
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
            _seal(self.sum_path, [self.path], {self.path: self.digest.hexdigest()})
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
    """The cache folder of one image-folder dataset (``dataset.root``): :meth:`prepare` builds
    or reuses its environments' files and attaches them (``env.decoded``, ``env.pixel_store``).
    ``stop`` and ``stopped``: see :func:`prepare`."""

    def __init__(self, dataset, stop=None, stopped=None):
        root = os.path.realpath(dataset.root)
        self.dataset = dataset
        self.name = type(dataset).__name__
        self.folder = os.path.join(cache_folder(),
                                   f"{_safe(os.path.basename(root))}-{_digest(root)[:12]}")
        self.budget = budget_bytes()
        self.stop, self.stopped = stop, stopped
        self.writable = True
        self.notes: list[str] = []
        self._noted: set[str] = set()
        self.quiet = False  # notes are kept for the prepare line instead of printed

    # budget and disk
    def usage(self) -> int:
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.folder):
                if entry.is_file() and not entry.name.startswith("."):
                    total += entry.stat().st_size
        return total

    def disk_room(self) -> int:
        """What the cache may still write on its disk (:func:`_disk_room`)."""
        try:
            return _disk_room(self.folder)
        except OSError:  # no folder (yet): its writes will say what is wrong
            return sys.maxsize

    def room(self) -> int:
        """Bytes the cache may add: within the budget, and leaving its disk some room."""
        return min(self.budget - self.usage(), self.disk_room())

    def fits(self, size: int) -> bool:
        return size <= self.room()

    def _note(self, note: str, stream=None, key: str | None = None) -> None:
        """Say ``note`` once per ``key`` (default: the note)."""
        key = key or note
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(note)
            if not self.quiet:
                print(f"Decoded-image cache: {note}", file=stream or sys.stdout, flush=True)

    def note_no_room(self, what: str, size: int) -> None:
        """Say that ``what`` (``size`` bytes) is not cached: over the budget, or too large for
        the disk's free space; and how to cache it."""
        used = self.usage()
        if used + size > self.budget:
            need = max(1, -(-(used + size) // 2**30))
            self._note(f"{what} of {self.name} ({gb(size)}) not cached: over the "
                       f"{gb(self.budget)} budget; to cache them set {BUDGET_ENV}={need}",
                       key=what)
            return
        free = _free_bytes(self.folder)
        self._note(f"{what} of {self.name} ({gb(size)}) not cached: the disk of {self.folder} has "
                   f"{gb(free)} free, and the cache leaves some free for the jobs' files; to "
                   f"cache them free space there or set {CACHE_ENV} to a folder on a disk with "
                   "room", key=what)

    def note_error(self, err: OSError) -> None:
        """Say that a write failed (one line; a full disk with its fix); nothing is written
        after it."""
        self.writable = False
        if err.errno in DISK_FULL_ERRNOS:
            self._note(f"no space left on the disk of {self.folder} ({err.strerror}); going on "
                       "without new cache files (images are read from their files); to cache "
                       f"them free space there or set {CACHE_ENV} to a folder on a disk with "
                       "room", sys.stderr, key="disk full")
            return
        self._note(f"could not write in {self.folder} ({err}); going on without new files",
                   sys.stderr)

    def discard(self, paths: list[str], sum_path: str, problem: str) -> None:
        """Remove a damaged entry's files (said once), so that it is built again; where they
        cannot be removed, say how to clear the folder."""
        try:
            for path in (sum_path, *paths):
                _remove(path)
        except OSError as err:
            self._note(f"damaged: {problem}; not used (it could not be removed: {err}); "
                       f"delete {self.folder} and rerun", sys.stderr)
            return
        self._note(f"damaged: {problem}; removed, to be built again", sys.stderr)

    def check_stop(self, doing: str) -> None:
        _check_stop(self.stop, self.stopped, doing)

    # building
    def _clean(self, stores: list[EnvCache]) -> None:
        """Remove files of earlier versions of these environments' images, and temporary files
        of processes that are gone."""
        current = {store.stem: store.digest for store in stores}
        for entry in os.scandir(self.folder):
            parts = entry.name.split(".")
            if entry.name.startswith(".") or len(parts) < 3:
                continue
            stale = parts[0] in current and parts[1] != current[parts[0]]
            if parts[-2] == "tmp":
                with contextlib.suppress(ValueError):
                    stale = stale or not _pid_alive(int(parts[-1]))
            if stale:
                _remove(entry.path)

    def _build_decoded(self, store: EnvCache, sizes: list[tuple[int, int, int]],
                       builders: Builders) -> None:
        import numpy as np

        data_path, index_path = store.decoded_paths()
        index = np.full((len(store.env.samples), 3), -1, dtype=np.int64)
        offset, todo = 0, []
        for item, height, width in sizes:
            if height and width:
                index[item] = (offset, height, width)
                todo.append((item, offset, height, width))
                offset += height * width * 3
        tmp = f"{data_path}.tmp.{os.getpid()}"
        try:
            _new_flat(tmp, offset)
            position = builders.position(store.env)
            missing = builders.map(_decode_into, [(position, tmp, chunk)
                                                  for chunk in _chunks(todo, builders.cores)])
            for item in (i for part in missing for i in part):
                index[item, 0] = -1
            digest = _file_digest(tmp)
            os.replace(tmp, data_path)
            _save_npy(index_path, index)
            _seal(store.decoded_sum(), [data_path, index_path], {data_path: digest})
        except BaseException:
            for path in (store.decoded_sum(), data_path, index_path):
                _remove(path)
            raise
        finally:
            _remove(tmp)
        store.open_decoded()

    def _build_plain(self, store: EnvCache, transform: PixelTransform, shape: tuple,
                     builders: Builders) -> None:
        import numpy as np

        data_path, ok_path = store.plain_paths(transform.key)
        sum_path = store.plain_sum(transform.key)
        n = len(store.env.samples)
        tmp = f"{data_path}.tmp.{os.getpid()}"
        try:
            start = _new_npy(tmp, (n, *shape))
            position = builders.position(store.env)
            done = builders.map(_pixels_into, [(position, tmp, start, shape, transform, chunk)
                                               for chunk in _chunks(list(range(n)),
                                                                    builders.cores)])
            ok = np.zeros(n, dtype=bool)
            ok[[i for part in done for i in part]] = True
            digest = _file_digest(tmp)
            os.replace(tmp, data_path)
            _save_npy(ok_path, ok)
            _seal(sum_path, [data_path, ok_path], {data_path: digest})
        except BaseException:
            for path in (sum_path, data_path, ok_path):
                _remove(path)
            raise
        finally:
            _remove(tmp)
        store.open_plain(transform.key)

    def _header_sizes(self, store: EnvCache,
                      builders: Builders) -> list[tuple[int, int, int]]:
        position = builders.position(store.env)
        tasks = [(position, chunk)
                 for chunk in _chunks(list(range(len(store.env.samples))), builders.cores)]
        return [row for part in builders.map(_header_sizes, tasks) for row in part]

    def prepare(self, cores: int = 1) -> str:
        """Build what is missing and fits the budget and the disk, attach every file to the
        environments, and return the line train prints (what was built or reused, its size and
        place, how to clear it, the budget, and what did not fit). A write that fails (a full
        disk) is said in the line, and the job goes on with the files that are complete; a stop
        signal (``stop``) raises ``stopped``."""
        self.quiet = True
        built, stores = [], []
        building = (f"building the decoded-image cache in {self.folder} (its unfinished files "
                    "removed)")
        builders = Builders(self.dataset.datasets, cores, check=lambda: self.check_stop(building))
        try:
            self.check_stop(f"preparing the decoded-image cache in {self.folder}")
            os.makedirs(self.folder, exist_ok=True)
            with _folder_lock(self.folder, self.stop, self.stopped):
                stores = [EnvCache(self, env) for env in self.dataset.datasets]
                self._clean(stores)
                plain = []  # (store, transform, shape): deterministic evaluation transforms
                for store in stores:
                    for transform in store.env.evaluation_pixel_transforms():
                        shape = transform.image_shape()
                        if shape is not None:
                            plain.append((store, transform, shape))
                missing = [s for s in stores if not s.open_decoded()]
                missing_plain = [(s, t, shape) for s, t, shape in plain
                                 if s.open_plain(t.key) is None]
                plain_size = sum(len(s.env.samples) * _prod(shape)
                                 for s, _, shape in missing_plain)
                room = self.room()
                sizes, decoded_size = {}, sum(s.file_bytes for s in missing)
                if missing and plain_size + decoded_size <= room:  # else surely over
                    sizes = {s.stem: self._header_sizes(s, builders) for s in missing}
                    decoded_size = sum(h * w * 3 for rows in sizes.values() for _, h, w in rows)
                if missing and plain_size + decoded_size <= room:
                    for store in missing:
                        self._build_decoded(store, sizes[store.stem], builders)
                        if "decoded images" not in built:
                            built.append("decoded images")
                elif missing:
                    self.note_no_room("the decoded images" + " (at least)" * (not sizes),
                                      decoded_size)
                if missing_plain and plain_size <= self.room():
                    for store, transform, shape in missing_plain:
                        self._build_plain(store, transform, shape, builders)
                        if "evaluation pixels" not in built:
                            built.append("evaluation pixels")
                elif missing_plain:
                    self.note_no_room("the evaluation pixels", plain_size)
        except OSError as err:
            self.check_stop(building)  # a build process ended by the stop signal (Slurm)
            self.note_error(err)
        finally:
            builders.close()
            self.quiet = False
        for store in stores:
            store.env.attach_cache(store)
        return self.line(built, stores)

    def line(self, built: list[str], stores: list[EnvCache]) -> str:
        decoded = sum(s.decoded is not None for s in stores)
        plain = sum(bool(s.plain) for s in stores)
        if built:
            state = f"built ({' and '.join(built)})"
        elif decoded or plain:
            state = "reused"
        else:
            state = "not used (images are decoded from their files as before)"
        notes = "".join(f"; {note}" for note in self.notes)
        return (f"Decoded-image cache: {state} for {self.name} ({decoded} of {len(stores)} "
                f"domains decoded, evaluation pixels of {plain}){notes}: {gb(self.usage())} on "
                f"disk in {self.folder}, read through the page cache (shared by this machine's "
                f"jobs); budget {gb(self.budget)} per dataset (${BUDGET_ENV}); off: "
                f"{SWITCH_ENV}=off; clear: rm -r {cache_folder()}")


def _safe(name: str) -> str:
    """``name`` as a file-name part without dots (the files' fields are split on dots), with a
    short hash of the real name (two names cannot meet)."""
    import re

    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[:40]}-{_digest(name)[:6]}"


def _prod(shape) -> int:
    out = 1
    for v in shape:
        out *= int(v)
    return out


def _save_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (via a temporary file and a rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _save_npy(path: str, array) -> None:
    """Save ``array`` to ``path`` (via a temporary file and a rename)."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array)
    _save_bytes(path, buffer.getvalue())


def prepare(dataset, cores: int = 1, stop=None, stopped=None) -> str | None:
    """Build or reuse the decoded-image cache of ``dataset`` (an image-folder dataset; None for
    any other, which has nothing to cache) with ``cores`` processes, attach it to its
    environments, and return the line a job prints about it. ``stop``: the job's
    :class:`~dg_plugins.signals.StopRequest`; once it caught a stop signal, waiting for another
    job's build, or building, raises ``stopped(signum, message)`` (train's ``Interrupted``:
    one line, the signal's exit status)."""
    if not hasattr(dataset, "datasets") or not all(
            hasattr(env, "attach_cache") for env in dataset.datasets) or not dataset.datasets:
        return None
    if not enabled():
        return (f"Decoded-image cache: off ({SWITCH_ENV}="
                f"{os.environ.get(SWITCH_ENV)}); images are decoded from their files")
    return DatasetCache(dataset, stop, stopped).prepare(cores)
