"""Load a sweep's ``results.jsonl`` records into a pandas DataFrame (protocol spec 7.5, 9.1, 9.6).

Like DomainBed's loader, :func:`load_records` reads ``<input_dir>/<entry>/results.jsonl`` for every
entry of ``os.listdir(input_dir)`` (one level, in listing order, so ties are broken as DomainBed
breaks them on the same folder) and keeps the records of incomplete jobs (no ``done`` file) and of
appended re-runs, as DomainBed does (spec 9.1, 12 item 2). Differences:

* a line that is not valid JSON (a job killed mid-write, a truncated copy) is skipped with a
  warning on stderr naming the file and the line number; DomainBed crashes on it. At most
  ``MAX_WARNINGS`` warnings are shown, then a count;
* a final line without a newline is parsed as is (DomainBed drops the last character of every line,
  spec 9.1); blank lines are ignored;
* a record lacking a required key (spec 9.6: ``args`` with trial_seed, dataset, algorithm,
  test_envs as a list of int, hparams_seed; ``step``) is skipped with a warning (DomainBed crashes
  or misgroups);
* an entry whose ``results.jsonl`` exists but cannot be read (e.g. permissions) gets a warning
  instead of being skipped silently;
* a NaN accuracy (JSON ``NaN``) counts as a missing key.

One row per record, in load order. Columns (DomainBed's selector names):
``args.trial_seed``, ``args.dataset``, ``args.algorithm``, ``args.test_envs`` (tuple of int),
``args.hparams_seed``, ``args.output_dir``, ``step``, ``hparams`` (the record's dict), ``job`` (the
entry name under ``input_dir``), ``line`` (1-based line number) and one float column per key of the
form ``env{i}_<split>_acc`` (``env0_in_acc``, ``env1_out_acc``, ``env2_uda_acc``,
``env0_in_ip_acc``, ...), NaN where a record lacks the key. Other keys (loss, epoch, ...) are
dropped. The ``hparams`` dicts are shared between the rows of a job: treat them as read-only.

Speed (spec 12 item 5; ``python -m dg_plugins.scripts.benchmark_collect``): no torch; lines are
parsed with ``orjson`` (a dependency, about 4x faster than :mod:`json`; lines it rejects, such as
NaN, Infinity or lone surrogates, go to :mod:`json`, and without orjson everything does; its one
difference from :mod:`json`: integers beyond 64 bits become floats); files are read with small
plain ``os.read`` calls; the rows of a job are collected in one go and their ``args`` stored once;
and with many files and two CPUs a forked worker reads the folder from the front while this
process reads it from the back (:class:`_Claims`), after importing pandas meanwhile: numpy and
pandas are imported only when the DataFrame is made, so a caller can start loading first
(:func:`start_loading`).
"""

from __future__ import annotations

import gc
import json
import math
import mmap
import os
import pickle
import re
import select
import signal
import struct
import sys
import threading
from array import array
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

try:  # a dependency, but parsing falls back to json without it
    import orjson as _orjson
except ImportError:
    _orjson = None

#: The arguments a record must carry (spec 9.6), read from its ``args`` dict.
REQUIRED_ARGS = ("trial_seed", "dataset", "algorithm", "test_envs", "hparams_seed")
#: Columns read from ``args`` (``output_dir`` is optional: only the hparams table shows it).
ARG_COLUMNS = tuple(f"args.{name}" for name in (*REQUIRED_ARGS, "output_dir"))
#: Record keys kept as float columns: ``env{i}_<anything>_acc``.
ACC_KEY = re.compile(r"env(\d+)_(\w+)_acc")

RESULTS_FILE = "results.jsonl"
MAX_WARNINGS = 20  # further problems are only counted, then summarised in one line
#: A forked worker helps from this many entries on (below, fork + transfer cost more than it saves).
PARALLEL_MIN_FILES = 1000
# Read size: results files are a few KB. A buffer above glibc's mmap threshold (128 KiB) makes
# every os.read map and unmap fresh pages: 1 MiB reads cost 3-6x more time on 10,000 files.
_READ_SIZE = 1 << 16
_JSON_SPACE = " \t\r\n"

Warn = Callable[[str], None]


def _print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Parsing lines


def parse_line(line: str):
    """The JSON value of ``line`` (orjson when importable, else :mod:`json`); raises
    ``ValueError`` if it is not valid JSON."""
    if _orjson is not None:
        try:
            return _orjson.loads(line)
        except ValueError:  # NaN, Infinity, a lone surrogate, or invalid: json decides
            pass
    return json.loads(line)


def _parse_file(text: str, where: Callable[[int], str], problems: list[str]):
    """``(line numbers, values)`` of the non-blank lines of a file; invalid lines are reported
    to ``problems`` and left out."""
    numbers, records = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip(_JSON_SPACE):
            continue
        try:
            records.append(parse_line(line))
            numbers.append(number)
        except ValueError as error:
            problems.append(f"skipping {where(number)}: not valid JSON ({error})")
    return numbers, records


# --------------------------------------------------------------------------------------------------
# Reading files


def result_files(input_dir: str) -> list[tuple[str, str]]:
    """``(entry, path of its results.jsonl)`` for every entry of ``input_dir`` in ``os.listdir``
    order (spec 9.1). Raises ``FileNotFoundError`` / ``NotADirectoryError`` naming ``input_dir``."""
    if not os.path.exists(input_dir):
        raise FileNotFoundError(f"input directory {input_dir!r} does not exist")
    if not os.path.isdir(input_dir):
        raise NotADirectoryError(f"input directory {input_dir!r} is not a directory")
    return [(entry, os.path.join(input_dir, entry, RESULTS_FILE))
            for entry in os.listdir(input_dir)]


def _read_text(path: str, problems: list[str]) -> str | None:
    """The file's text, or None when it is absent (not a job folder, or no record yet)."""
    try:
        fd = os.open(path, os.O_RDONLY)  # plain os calls: twice as fast as open() on 10k files
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        problems.append(f"cannot read {path}: {error}")
        return None
    try:
        chunks = [os.read(fd, _READ_SIZE)]
        while len(chunks[-1]) == _READ_SIZE:  # a short read means the end of a regular file
            chunks.append(os.read(fd, _READ_SIZE))
    except OSError as error:
        problems.append(f"cannot read {path}: {error}")
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


_get_step = itemgetter("step")


def _get_hparams(record: dict):
    return record.get("hparams")


def _getter(keys: list[str]) -> Callable[[dict], tuple]:
    """``record -> tuple of record[k] for k in keys``."""
    if len(keys) > 1:
        return itemgetter(*keys)
    if keys:
        return lambda record, key=keys[0]: (record[key],)
    return lambda record: ()


def _arg_row(args) -> tuple | str:
    """The ``ARG_COLUMNS`` values of an ``args`` dict, or why it is unusable (spec 9.6)."""
    if type(args) is not dict:
        return "no 'args' object"
    missing = [name for name in REQUIRED_ARGS if name not in args]
    if missing:
        return "missing " + ", ".join(f"args.{name}" for name in missing)
    envs = args["test_envs"]
    if not isinstance(envs, list) or not all(type(e) is int for e in envs):
        return "args.test_envs is not a list of int"
    return (*(args[name] for name in REQUIRED_ARGS[:3]), tuple(envs), args["hparams_seed"],
            args.get("output_dir"))


class _Columns:
    """Rows collected column by column (picklable, so that a worker can send them back).

    Rows come in *segments*: runs of consecutive records of one job sharing ``args``, stored once
    per segment (``jobs``, ``arg_rows``, ``sizes``) and repeated with numpy in :meth:`frame`.
    ``layouts`` maps a record's key tuple to ``[acc keys, row positions, acc values]`` (positions
    as ``array('q')``, values as a flat ``array('d')``, row-major): records with the same keys
    become one float block."""

    def __init__(self) -> None:
        self.jobs: list = []
        self.arg_rows: list[tuple] = []
        self.sizes: list[int] = []
        self.lines: list[int] = []
        self.steps: list = []
        self.hparams: list = []
        self.layouts: dict[tuple, list] = {}
        self.problems: list[str] = []
        self._getters: dict[tuple, Callable] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def __getstate__(self):  # the getters (lambdas) are rebuilt where needed, not pickled
        return {k: v for k, v in self.__dict__.items() if k != "_getters"}

    def __setstate__(self, state):
        self.__dict__.update(state, _getters={})

    def extend(self, other: "_Columns") -> None:
        offset = len(self)
        for name in ("jobs", "arg_rows", "sizes", "lines", "steps", "hparams", "problems"):
            getattr(self, name).extend(getattr(other, name))
        for keys, (acc_keys, positions, values) in other.layouts.items():
            mine = self._layout(keys, acc_keys)
            mine[1].extend(p + offset for p in positions)
            mine[2].extend(values)

    def add(self, job, numbers, records: list, where: Callable[[int], str]) -> None:
        """Add the parsed lines of one job (``numbers``: their line numbers); unusable ones
        become problems."""
        if records and self._add_uniform(job, numbers, records):
            return
        arg_rows: dict[int, tuple] = {}  # id(args) -> (args, row or reason); args kept alive
        for number, record in zip(numbers, records):
            if type(record) is not dict:
                self.problems.append(f"skipping {where(number)}: not a JSON object")
                continue
            args = record.get("args")
            known = arg_rows.get(id(args))
            if known is None:
                known = arg_rows[id(args)] = (args, _arg_row(args))
            row = known[1]
            if type(row) is str or "step" not in record:
                reason = row if type(row) is str else "missing step"
                self.problems.append(f"skipping {where(number)}: {reason}")
                continue
            self._append(job, [number], [record], row)

    def _add_uniform(self, job, numbers, records: list) -> bool:
        """The usual case in one go: valid records with the same keys and ``args``."""
        first = records[0]
        if type(first) is not dict or "step" not in first or "args" not in first:
            return False
        args, keys = first.get("args"), first.keys()
        for record in records:
            if type(record) is not dict or record.keys() != keys:
                return False
            other = record["args"]
            if other is not args and other != args:
                return False
        row = _arg_row(args)
        if type(row) is str:
            return False
        self._append(job, numbers, records, row)
        return True

    def _layout(self, keys: tuple, acc_keys: list[str] | None = None) -> list:
        layout = self.layouts.get(keys)
        if layout is None:
            if acc_keys is None:
                acc_keys = [k for k in keys if ACC_KEY.fullmatch(k)]
            layout = self.layouts[keys] = [acc_keys, array("q"), array("d")]
            self._getters[keys] = _getter(acc_keys)
        return layout

    def _append(self, job, numbers, records: list, row: tuple) -> None:
        """Append valid records that share ``args`` (``row``) and keys."""
        keys = tuple(records[0])
        _, positions, values = self._layout(keys)
        start = len(self)
        positions.extend(range(start, start + len(records)))
        flat = chain.from_iterable(map(self._getters[keys], records))
        size = len(values)
        try:
            values.extend(flat)
        except (TypeError, OverflowError):  # a non-numeric accuracy: keep what is numeric
            del values[size:]
            values.extend(map(_number, chain.from_iterable(map(self._getters[keys], records))))
        self.steps.extend(map(_get_step, records))
        # One hparams object per job when they are equal (less memory, faster worker transfer).
        first = records[0].get("hparams")
        self.hparams.extend(first if hparams == first else hparams
                            for hparams in map(_get_hparams, records))
        self.lines.extend(numbers)
        if self.arg_rows and self.jobs[-1] == job and self.arg_rows[-1] is row:
            self.sizes[-1] += len(records)
        else:
            self.jobs.append(job)
            self.arg_rows.append(row)
            self.sizes.append(len(records))

    def frame(self) -> "pd.DataFrame":
        import numpy as np
        import pandas as pd

        columns: dict[str, object] = {}
        sizes = np.array(self.sizes, dtype=np.int64)
        values = list(zip(*self.arg_rows)) if self.arg_rows else [()] * len(ARG_COLUMNS)
        for name, column in zip(ARG_COLUMNS, values):
            # Seeds: let pandas infer (int64 normally); the rest stays Python objects.
            if name.endswith("_seed"):
                columns[name] = pd.Series(list(column)).to_numpy().repeat(sizes)
            else:
                columns[name] = _object_array(column, sizes)
        columns["step"] = self.steps
        columns["hparams"] = _object_array(self.hparams)
        columns["job"] = _object_array(self.jobs, sizes)
        columns["line"] = np.array(self.lines, dtype=np.int64)
        acc_keys = sorted({k for layout in self.layouts.values() for k in layout[0]},
                          key=_acc_sort_key)
        index = {key: i for i, key in enumerate(acc_keys)}
        accs = np.full((len(self), len(acc_keys)), np.nan)
        for keys, positions, flat in self.layouts.values():
            if keys:
                block = np.frombuffer(flat, dtype=float).reshape(len(positions), len(keys))
                if len(keys) == len(acc_keys) and len(positions) == len(accs):
                    accs[:, [index[k] for k in keys]] = block
                else:
                    rows = np.frombuffer(positions, dtype=np.int64)
                    accs[np.ix_(rows, [index[k] for k in keys])] = block
        for i, key in enumerate(acc_keys):
            columns[key] = accs[:, i]
        return pd.DataFrame(columns)


def _object_array(values, repeats: "np.ndarray | None" = None) -> "pd.Series":
    """A Series of Python objects, each value repeated ``repeats[i]`` times if given (pandas
    would otherwise convert strings to its string dtype, slower to iterate)."""
    import numpy as np
    import pandas as pd

    array = np.fromiter(values, dtype=object, count=len(values))
    if repeats is not None:
        array = array.repeat(repeats)
    return pd.Series(array, dtype=object, copy=False)


def _number(value) -> float:
    """An accuracy value as a float; NaN if it is not a number."""
    try:
        return float(value) if isinstance(value, (int, float)) else math.nan
    except OverflowError:
        return math.nan


def _acc_sort_key(key: str):
    match = ACC_KEY.fullmatch(key)
    return int(match.group(1)), match.group(2)


def _scan(files: Iterable[tuple[str, str]], columns: _Columns | None = None) -> _Columns:
    """Read and parse the given ``(entry, path)`` files into ``columns`` (default: new ones;
    problems collected) and return them."""
    columns = _Columns() if columns is None else columns
    collecting = gc.isenabled()
    gc.disable()  # the cyclic GC would rescan the growing columns again and again (~10% time)
    try:
        for entry, path in files:
            text = _read_text(path, columns.problems)
            if text is None:
                continue

            def where(number, path=path):
                return f"line {number} of {path}"

            numbers, records = _parse_file(text, where, columns.problems)
            columns.add(entry, numbers, records, where)
    finally:
        if collecting:
            gc.enable()
    return columns


# --------------------------------------------------------------------------------------------------
# Loading, optionally with a forked worker


class _Claims:
    """The files not yet taken, shared by this process and a forked worker: the worker takes
    chunks from the front, this process from the back, until they meet. Whichever is faster
    (the parent also imports pandas meanwhile; reading speed varies with the page cache) simply
    takes more. The bounds are two int64 in shared memory; a byte in a pipe is the lock (whoever
    has read it holds it), waited for with a timeout so that a side that died holding it cannot
    block the other."""

    CHUNK = 64  # files per claim: ~3 ms of work, so the two sides end within a few ms

    def __init__(self, n_files: int) -> None:
        self._bounds = mmap.mmap(-1, 16)  # MAP_SHARED: the forked worker sees the same page
        struct.pack_into("qq", self._bounds, 0, 0, n_files)
        self._lock_read, self._lock_write = os.pipe()
        os.write(self._lock_write, b"L")

    def bounds(self) -> tuple[int, int]:
        """``(front, back)``: files ``[0, front)`` went to the worker, ``[back, n)`` to us."""
        return struct.unpack_from("qq", self._bounds)

    def take(self, from_front: bool, other_alive: Callable[[], bool]) -> tuple[int, int] | None:
        """Claim the next chunk ``(start, end)`` from one end, or None when nothing is left."""
        locked = self._acquire(other_alive)
        try:
            front, back = self.bounds()
            if front >= back:
                return None
            if from_front:
                start, end = front, min(back, front + self.CHUNK)
                struct.pack_into("q", self._bounds, 0, end)
            else:
                start, end = max(front, back - self.CHUNK), back
                struct.pack_into("q", self._bounds, 8, start)
            return start, end
        finally:
            if locked:
                os.write(self._lock_write, b"L")

    def _acquire(self, other_alive: Callable[[], bool]) -> bool:
        """Take the lock; False (go on unlocked) if the other side is gone."""
        while True:
            ready, _, _ = select.select([self._lock_read], [], [], 0.2)
            if ready:
                os.read(self._lock_read, 1)
                return True
            if not other_alive():
                return False

    def close(self) -> None:
        if not self._bounds.closed:
            for fd in (self._lock_read, self._lock_write):
                os.close(fd)
            self._bounds.close()

    def __del__(self) -> None:  # a Loading dropped without its result
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _Worker:
    """A forked child that scans the chunks it claims from the front of ``files`` and pickles
    its :class:`_Columns` into a pipe. If anything goes wrong with it, :meth:`result` scans the
    files it claimed in this process instead."""

    def __init__(self, files: list[tuple[str, str]], claims: _Claims) -> None:
        self.files, self.claims = files, claims
        self.pid, self.status, self._read_fd = None, None, None
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            return
        if pid == 0:  # the child: never returns
            status = 1
            try:
                os.close(read_fd)
                columns = _Columns()
                alive = lambda: os.getppid() == parent  # noqa: E731
                while (chunk := claims.take(True, alive)) is not None:
                    _scan(files[chunk[0]:chunk[1]], columns)
                payload = pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write_fd, "wb") as pipe:
                    pipe.write(payload)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        self.pid, self._read_fd = pid, read_fd

    def alive(self) -> bool:
        """Whether the child still runs (reaping it, and keeping its status, if it ended)."""
        if self.pid is None or self.status is not None:
            return False
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.status = status
        return not pid

    def result(self) -> _Columns:
        """The child's columns (files ``[0, front)``), once this process took its last chunk."""
        if self.pid is None:
            return _Columns()
        try:
            with os.fdopen(self._read_fd, "rb") as pipe:
                payload = pipe.read()
        finally:
            self._read_fd = None
            if self.status is None:
                self.status = os.waitpid(self.pid, 0)[1]
            self.pid = None
        try:
            if self.status == 0:
                return pickle.loads(payload)
        except Exception:  # noqa: BLE001 - a broken transfer: redo the work here
            pass
        return _scan(self.files[:self.claims.bounds()[0]])

    def close(self) -> None:
        """Stop and reap the child if its result was never collected."""
        if self.pid is not None:
            os.close(self._read_fd)
            if self.status is None:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            self.pid = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Loading:
    """Records being loaded (see :func:`start_loading`); :meth:`result` gives the DataFrame."""

    def __init__(self, input_dir: str, warn: Warn, progress: bool | None,
                 parallel: bool | None) -> None:
        self.files = result_files(input_dir)
        self.warn = warn
        self.progress = sys.stderr.isatty() if progress is None else progress
        if parallel is None:
            parallel = (len(self.files) >= PARALLEL_MIN_FILES and _usable_cpus() >= 2
                        and threading.active_count() == 1)  # forking beside threads is unsafe
        self._claims = self._worker = None
        if parallel and hasattr(os, "fork") and len(self.files) > 1:
            self._claims = _Claims(len(self.files))
            self._worker = _Worker(self.files, self._claims)

    def result(self) -> "pd.DataFrame":
        if self._worker is None:
            columns = _scan(self._with_progress(self.files))
        else:
            columns = self._result_with_worker()
        for message in columns.problems[:MAX_WARNINGS]:
            self.warn(message)
        if len(columns.problems) > MAX_WARNINGS:
            self.warn(f"{len(columns.problems) - MAX_WARNINGS} more problems not shown "
                      f"({len(columns.problems)} lines or files skipped in total)")
        return columns.frame()

    def _result_with_worker(self) -> _Columns:
        """Take chunks from the back until the worker and this process meet, then join the
        worker's columns (the front) and ours, in listing order."""
        bar = self._progress_bar()
        mine: list[_Columns] = []  # from the back: reversed at the end
        try:
            while (chunk := self._claims.take(False, self._worker.alive)) is not None:
                mine.append(_scan(self.files[chunk[0]:chunk[1]]))
                if bar is not None:
                    front, back = self._claims.bounds()
                    bar.update(front + len(self.files) - back - bar.n)
            columns = self._worker.result()
        finally:
            if bar is not None:
                bar.close()
            self._worker.close()
            self._claims.close()
        for part in reversed(mine):
            columns.extend(part)
        return columns

    def _with_progress(self, files: list) -> Iterable:
        bar = self._progress_bar()
        if bar is None:
            return files

        def advancing():
            with bar:
                for item in files:
                    yield item
                    bar.update()
        return advancing()

    def _progress_bar(self):
        if not self.progress:
            return None
        import tqdm  # only for terminals: its import costs 0.1 s

        return tqdm.tqdm(total=len(self.files), ncols=80, leave=False)


def _usable_cpus() -> int:
    """CPUs this process may run on. The worker is used whenever there are two: measured on a
    2-CPU machine under a load average of 1-2, it still cut the whole run from ~2.0 s to ~1.4 s
    (10,000 jobs), so no load-average gate (a lagging 1-minute average kept it off)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def start_loading(input_dir: str, warn: Warn = _print_warning, progress: bool | None = None,
                  parallel: bool | None = None) -> Loading:
    """Start loading ``input_dir`` (listing it and, if ``parallel``, forking a worker that reads
    part of it) and return at once; ``.result()`` finishes and returns the DataFrame. Lets a
    caller import pandas while the worker reads. Raises like :func:`result_files`."""
    return Loading(input_dir, warn, progress, parallel)


def load_records(input_dir: str, warn: Warn = _print_warning, progress: bool | None = None,
                 parallel: bool | None = None) -> "pd.DataFrame":
    """Every usable record of ``input_dir/<job>/results.jsonl`` as a DataFrame (module docstring;
    spec 9.1). Problems go to ``warn`` (default: stderr); ``progress`` shows a tqdm bar on stderr
    (default: when stderr is a terminal); ``parallel`` forks a worker for part of the files
    (default: from ``PARALLEL_MIN_FILES`` files on, with two or more usable CPUs and no other
    thread running; the result is the same).
    Raises ``FileNotFoundError``/``NotADirectoryError`` if ``input_dir`` is missing."""
    return start_loading(input_dir, warn, progress, parallel).result()


def records_frame(records: Iterable[dict]) -> "pd.DataFrame":
    """The records DataFrame (module docstring) of in-memory record dicts (``job`` is None,
    ``line`` counts from 1). Raises ValueError on an unusable record."""
    columns = _Columns()
    records = list(records)
    columns.add(None, range(1, len(records) + 1), records, lambda number: f"record {number}")
    if columns.problems:
        raise ValueError(columns.problems[0])
    return columns.frame()


# --------------------------------------------------------------------------------------------------
# Queries used by selection and tables


def acc_width(records: pd.DataFrame) -> int:
    """One more than the largest environment index of any accuracy column (0 if none)."""
    width = 0
    for column in records.columns:
        match = ACC_KEY.fullmatch(column)
        if match:
            width = max(width, int(match.group(1)) + 1)
    return width


def acc_columns(records: pd.DataFrame, split: str) -> list[str]:
    """Column names ``env{i}_{split}_acc`` for i = 0..W-1 (W: :func:`acc_width`); some may be
    absent from ``records``."""
    return [f"env{i}_{split}_acc" for i in range(acc_width(records))]


def acc_matrix(records: pd.DataFrame, key: str) -> np.ndarray:
    """``records[key.format(t=i)]`` for i = 0..W-1 (W: :func:`acc_width`) as a (records x W)
    float array, NaN where absent; ``key`` is a template such as ``env{t}_out_acc``."""
    import numpy as np

    columns = [key.format(t=i) for i in range(acc_width(records))]
    return records.reindex(columns=columns).to_numpy(dtype=float, na_value=np.nan)


def leading_count(present: np.ndarray) -> np.ndarray:
    """Per row, how many consecutive True values start the row (DomainBed counts environments
    by probing ``env0_..``, ``env1_..`` until a key is missing; spec 9.4)."""
    import numpy as np

    if present.shape[1] == 0:
        return np.zeros(len(present), dtype=int)
    return np.where(present.all(axis=1), present.shape[1], (~present).argmax(axis=1))


def environment_count(records: pd.DataFrame) -> int:
    """Number of environments seen in ``records``: the largest count of consecutive
    ``env{i}_in_acc`` keys of any record (used for datasets the catalog does not know)."""
    import numpy as np

    if not len(records):
        return 0
    return int(leading_count(~np.isnan(acc_matrix(records, "env{t}_in_acc"))).max())
