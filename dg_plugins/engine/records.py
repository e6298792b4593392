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

Speed (spec 12 item 5; ``python -m dg_plugins.scripts.benchmark_collect``): no torch; the ``args``
object, which repeats verbatim on every line of a job, is decoded once per job
(:class:`_LineParser`); the rows of a job are collected in one go; and with many files and an idle
CPU a forked worker reads part of the folder (:func:`start_loading`). numpy and pandas are imported
only when the DataFrame is made, so a caller can start loading before paying for their import.
If ``orjson`` is installed (it is not a dependency), lines are parsed with it, about 4x faster;
lines it rejects (NaN, Infinity, lone surrogates) go to :mod:`json`. Its one difference from
:mod:`json`: integers beyond 64 bits become floats.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import signal
import sys
import threading
from operator import itemgetter
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

try:  # optional: about 4x faster parsing when installed (not a dependency)
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
_WORKER_SHARE = 0.65  # the parent also imports pandas meanwhile, so the worker takes more files
_READ_SIZE = 1 << 20
_JSON_SPACE = " \t\r\n"

Warn = Callable[[str], None]


def _print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Parsing one line


class _LineParser:
    """``json.loads`` that decodes a job's ``args`` once instead of on every line.

    DomainBed writes sorted-key records, so a line starts with ``{"args": {...}`` and all lines of
    a job repeat the same args text. After decoding that prefix once (``raw_decode``), a line
    starting with the same text is parsed with the args replaced by a short sentinel string, and
    the decoded args dict (shared by those records) is put back. The top-level ``args`` of such a
    line is necessarily that text, so the result equals ``json.loads(line)`` (the sentinel check
    also covers a repeated ``args`` key). Other lines are parsed in full. The C scanner is called
    directly: ``json.loads``' Python wrapping costs about as much as decoding the args.
    """

    PREFIX = '{"args": '
    SENTINEL = "\x00dg_plugins cached args\x00"

    def __init__(self) -> None:
        decoder = json.JSONDecoder()
        self._scan_once = decoder.scan_once
        self._raw_decode = decoder.raw_decode
        self._replaced = self.PREFIX + json.dumps(self.SENTINEL)
        self._known: tuple[str, dict] | None = None  # (line prefix up to the end of args, args)

    def parse(self, line: str):
        """The JSON value of ``line``; raises ``ValueError`` if it is not valid JSON."""
        if _orjson is not None:
            try:
                return _orjson.loads(line)
            except ValueError:  # NaN, Infinity, a lone surrogate, or invalid: json decides
                pass
        known = self._known
        if known is None or not line.startswith(known[0]):
            known = self._learn(line)
        if known is not None:
            reduced = self._replaced + line[len(known[0]):]
            try:
                record, end = self._scan_once(reduced, 0)
            except (ValueError, StopIteration):
                record = end = None
            if (type(record) is dict and record.get("args") == self.SENTINEL
                    and (end == len(reduced) or not reduced[end:].strip(_JSON_SPACE))):
                record["args"] = known[1]
                return record
        return json.loads(line)

    def _learn(self, line: str):
        if line.startswith(self.PREFIX):
            try:
                args, end = self._raw_decode(line, len(self.PREFIX))
            except ValueError:
                return None
            if type(args) is dict:
                self._known = (line[:end], args)
                return self._known
        return None

    def parse_file(self, text: str, where: Callable[[int], str], problems: list[str]):
        """``(line numbers, values)`` of the non-blank lines of a file; invalid lines are
        reported to ``problems`` and left out."""
        numbers, records = [], []
        parse = self.parse
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip(_JSON_SPACE):
                continue
            try:
                records.append(parse(line))
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

    ``layouts`` maps a record's key tuple to ``[acc keys, row positions, acc value tuples]``:
    records with the same keys are turned into one float block at the end."""

    def __init__(self) -> None:
        self.jobs: list = []
        self.lines: list[int] = []
        self.arg_rows: list[tuple] = []
        self.hparams: list = []
        self.steps: list = []
        self.layouts: dict[tuple, list] = {}
        self.problems: list[str] = []
        self._getters: dict[tuple, Callable] = {}

    def __getstate__(self):  # the getters (lambdas) are rebuilt where needed, not pickled
        return {k: v for k, v in self.__dict__.items() if k != "_getters"}

    def __setstate__(self, state):
        self.__dict__.update(state, _getters={})

    def extend(self, other: "_Columns") -> None:
        offset = len(self.steps)
        for name in ("jobs", "lines", "arg_rows", "hparams", "steps", "problems"):
            getattr(self, name).extend(getattr(other, name))
        for keys, (acc_keys, positions, rows) in other.layouts.items():
            if keys not in self.layouts:
                self.layouts[keys] = [acc_keys, [], []]
                self._getters[keys] = other._getters.get(keys) or _getter(acc_keys)
            mine = self.layouts[keys]
            mine[1].extend(p + offset for p in positions)
            mine[2].extend(rows)

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

    def _append(self, job, numbers, records: list, row: tuple) -> None:
        """Append valid records that share ``args`` (``row``) and keys."""
        keys = tuple(records[0])
        layout = self.layouts.get(keys)
        if layout is None:
            acc_keys = [k for k in keys if ACC_KEY.fullmatch(k)]
            layout = self.layouts[keys] = [acc_keys, [], []]
            self._getters[keys] = _getter(acc_keys)
        start = len(self.steps)
        layout[1].extend(range(start, start + len(records)))
        layout[2].extend(map(self._getters[keys], records))
        self.steps.extend(map(_get_step, records))
        # One hparams object per job when they are equal (less memory, faster worker transfer).
        first = records[0].get("hparams")
        self.hparams.extend(first if hparams == first else hparams
                            for hparams in map(_get_hparams, records))
        self.jobs.extend([job] * len(records))
        self.lines.extend(numbers)
        self.arg_rows.extend([row] * len(records))

    def frame(self) -> "pd.DataFrame":
        import numpy as np
        import pandas as pd

        columns: dict[str, object] = {}
        values = list(zip(*self.arg_rows)) if self.arg_rows else [()] * len(ARG_COLUMNS)
        for name, column in zip(ARG_COLUMNS, values):
            # Seeds: let pandas infer (int64 normally); the rest stays Python objects.
            columns[name] = list(column) if name.endswith("_seed") else _object_array(column)
        columns["step"] = self.steps
        columns["hparams"] = _object_array(self.hparams)
        columns["job"] = _object_array(self.jobs)
        columns["line"] = self.lines
        acc_keys = sorted({k for layout in self.layouts.values() for k in layout[0]},
                          key=_acc_sort_key)
        index = {key: i for i, key in enumerate(acc_keys)}
        accs = np.full((len(self.steps), len(acc_keys)), np.nan)
        for keys, positions, rows in self.layouts.values():
            if keys:
                block = _as_floats(rows)
                if len(keys) == len(acc_keys) and len(positions) == len(accs):
                    accs[:, [index[k] for k in keys]] = block
                else:
                    accs[np.ix_(positions, [index[k] for k in keys])] = block
        for i, key in enumerate(acc_keys):
            columns[key] = accs[:, i]
        return pd.DataFrame(columns)


def _object_array(values) -> "pd.Series":
    """A Series of Python objects (pandas would otherwise convert strings to its string dtype,
    slower to iterate)."""
    import numpy as np
    import pandas as pd

    return pd.Series(np.fromiter(values, dtype=object, count=len(values)), dtype=object, copy=False)


def _acc_sort_key(key: str):
    match = ACC_KEY.fullmatch(key)
    return int(match.group(1)), match.group(2)


def _as_floats(rows: list[tuple]) -> "np.ndarray":
    import numpy as np

    try:
        return np.array(rows, dtype=float).reshape(len(rows), -1)
    except (TypeError, ValueError):  # a non-numeric accuracy: keep what is numeric
        def number(value):
            return float(value) if isinstance(value, (int, float)) else np.nan
        return np.array([[number(v) for v in row] for row in rows], dtype=float)


def _scan(files: Iterable[tuple[str, str]]) -> _Columns:
    """Read and parse the given ``(entry, path)`` files into columns (problems collected)."""
    columns = _Columns()
    parser = _LineParser()
    collecting = gc.isenabled()
    gc.disable()  # the cyclic GC would rescan the growing columns again and again (~10% time)
    try:
        for entry, path in files:
            text = _read_text(path, columns.problems)
            if text is None:
                continue

            def where(number, path=path):
                return f"line {number} of {path}"

            numbers, records = parser.parse_file(text, where, columns.problems)
            columns.add(entry, numbers, records, where)
    finally:
        if collecting:
            gc.enable()
    return columns


# --------------------------------------------------------------------------------------------------
# Loading, optionally with a forked worker


class _Worker:
    """A forked child that scans some files and pickles its :class:`_Columns` into a pipe. If
    anything goes wrong with it, :meth:`result` scans those files in this process instead."""

    def __init__(self, files: list[tuple[str, str]]) -> None:
        self.files, self.pid, self._read_fd = files, None, None
        read_fd, write_fd = os.pipe()
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
                payload = pickle.dumps(_scan(files), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write_fd, "wb") as pipe:
                    pipe.write(payload)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        self.pid, self._read_fd = pid, read_fd

    def result(self) -> _Columns:
        if self.pid is None:
            return _scan(self.files)
        try:
            with os.fdopen(self._read_fd, "rb") as pipe:
                payload = pipe.read()
        finally:
            self._read_fd = None
            _, status = os.waitpid(self.pid, 0)
            self.pid = None
        try:
            if status == 0:
                return pickle.loads(payload)
        except Exception:  # noqa: BLE001 - a broken transfer: redo the work here
            pass
        return _scan(self.files)

    def close(self) -> None:
        """Stop and reap the child if its result was never collected."""
        if self.pid is not None:
            os.close(self._read_fd)
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
        self._worker = None
        self._mine = self.files
        if parallel and hasattr(os, "fork") and len(self.files) > 1:
            split = max(1, int(len(self.files) * (1 - _WORKER_SHARE)))
            self._mine = self.files[:split]
            self._worker = _Worker(self.files[split:])

    def result(self) -> "pd.DataFrame":
        files = self._mine
        if self.progress:
            import tqdm  # only for terminals: its import costs 0.1 s

            files = tqdm.tqdm(files, ncols=80, leave=False)
        columns = _scan(files)
        if self._worker is not None:
            columns.extend(self._worker.result())
        for message in columns.problems[:MAX_WARNINGS]:
            self.warn(message)
        if len(columns.problems) > MAX_WARNINGS:
            self.warn(f"{len(columns.problems) - MAX_WARNINGS} more problems not shown "
                      f"({len(columns.problems)} lines or files skipped in total)")
        return columns.frame()


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


def acc_columns(records: pd.DataFrame, split: str) -> list[str]:
    """Column names ``env{i}_{split}_acc`` for i = 0..W-1 where W is one more than the largest
    environment index of any accuracy column; some may be absent from ``records``."""
    width = 0
    for column in records.columns:
        match = ACC_KEY.fullmatch(column)
        if match:
            width = max(width, int(match.group(1)) + 1)
    return [f"env{i}_{split}_acc" for i in range(width)]


def acc_matrix(records: pd.DataFrame, split: str) -> np.ndarray:
    """``records[env{i}_{split}_acc]`` for every i as a float array (NaN where absent)."""
    import numpy as np

    columns = acc_columns(records, split)
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
    return int(leading_count(~np.isnan(acc_matrix(records, "in"))).max())
