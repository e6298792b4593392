"""A sweep's records as a pandas DataFrame, read as DomainBed's ``reporting.load_records``
reads them, fast and without torch (orjson, column by column), and its job folders' counts
(docs/collect.md)."""

from __future__ import annotations

import gc
import json
import math
import os
import re
import sys
from array import array
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Callable, NamedTuple

import numpy as np
import orjson
import pandas as pd

from dg_plugins.job.flags import ROWS, compute_settings
from dg_plugins.job.flags import names as flag_names
from dg_plugins.job.folder import JOB_FILES, RESULTS_FILE, is_done


class _ArgValues(NamedTuple):
    """The ``args`` of a record that become columns (``args.<name>``)."""

    trial_seed: object
    dataset: object
    algorithm: object
    test_envs: tuple
    hparams_seed: object
    output_dir: object  # optional: only the hparams table shows it
    label_fraction: float  # optional: UDG jobs (dg_plugins.train.udg); NaN otherwise
    compute: object  # ((name, value), ...): train's compute settings not at their defaults; NaN
    settings: object  # ((name, value), ...): the SETTING_ARGS not at their defaults; NaN


#: The ``args`` a record must carry (those DomainBed's collect_results reads).
REQUIRED_ARGS = _ArgValues._fields[:5]
#: train's hashed flags that DomainBed's grouping ignores but that change what a job computes:
#: jobs of one cell that differ in one are noted (report.mixed_settings_notes). Left out: the data
#: folder, the seed (derived from the grouping keys), the label fraction (a UDG table key).
SETTING_ARGS = tuple(name for name in flag_names(hashed=True)
                     if name not in (*REQUIRED_ARGS, "data_dir", "seed", "label_fraction"))
ARG_COLUMNS = tuple(f"args.{name}" for name in _ArgValues._fields)
#: Record keys kept as float columns: accuracies, subset sizes (IP/OOP records, for pooling by
#: count) and other numbers.
ACC_KEY = re.compile(r"env(\d+)_(\w+)_acc")
COUNT_KEY = re.compile(r"env(\d+)_(\w+)_count")
NUMBER_KEYS = ("num_classes",)

JOB_FOLDER_NAME = re.compile(r"[0-9a-f]{32}")  # md5 (DomainBed's sweep.py Job)
MAX_WARNINGS = 20  # further problems are only counted, then summarised in one line
# Read size: results files are a few KB. A buffer above glibc's mmap threshold (128 KiB) makes
# every os.read map and unmap fresh pages: 1 MiB reads cost 3-6x more time on 10,000 files.
_READ_SIZE = 1 << 16
_JSON_SPACE = " \t\r\n"


def _print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def load_records(input_dir: str, warn: Callable[[str], None] = _print_warning,
                 progress: bool | None = None) -> pd.DataFrame:
    """Every usable record of ``input_dir/<job>/results.jsonl``, a row each (columns:
    docs/collect.md); unusable lines and files go to ``warn`` (at most :data:`MAX_WARNINGS`)."""
    if not os.path.exists(input_dir):
        raise FileNotFoundError(f"input directory {input_dir!r} does not exist")
    if not os.path.isdir(input_dir):
        raise NotADirectoryError(f"input directory {input_dir!r} is not a directory")
    entries = os.listdir(input_dir)  # DomainBed's order (reporting.load_records)
    if sys.stderr.isatty() if progress is None else progress:
        import tqdm  # only for terminals: its import costs 0.1 s

        entries = tqdm.tqdm(entries, ncols=80, leave=False)
    columns = _Columns()
    collecting = gc.isenabled()
    gc.disable()  # the cyclic GC would rescan the growing columns again and again (~10% time)
    try:
        for entry in entries:
            path = os.path.join(input_dir, entry, RESULTS_FILE)
            text = _read_text(path, columns.problems)
            if text is not None:
                columns.add_file(entry, path, text)
    finally:
        if collecting:
            gc.enable()
    for message in columns.problems[:MAX_WARNINGS]:
        warn(message)
    if len(columns.problems) > MAX_WARNINGS:
        warn(f"{len(columns.problems) - MAX_WARNINGS} more problems not shown "
             f"({len(columns.problems)} lines or files skipped in total)")
    return columns.frame()


def _read_text(path: str, problems: list[str]) -> str | None:
    """The file's text, or None when it is absent (not a job folder, or no record yet)."""
    try:
        fd = os.open(path, os.O_RDONLY)  # plain os calls: twice as fast as open() on 10k files
        try:
            chunks = [os.read(fd, _READ_SIZE)]
            while len(chunks[-1]) == _READ_SIZE:  # a short read means the end of a regular file
                chunks.append(os.read(fd, _READ_SIZE))
        finally:
            os.close(fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        problems.append(f"cannot read {path}: {error}")
        return None
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def parse_line(line: str):
    """The JSON value of ``line`` (orjson's, else json's); ``ValueError`` if not JSON."""
    try:
        return orjson.loads(line)
    except ValueError:  # NaN, Infinity, a lone surrogate, or invalid: json decides
        return json.loads(line)


def _arg_values(args) -> _ArgValues | str:
    """The column values of an ``args`` dict, or why it is unusable."""
    if type(args) is not dict:
        return "no 'args' object"
    missing = [name for name in REQUIRED_ARGS if name not in args]
    if missing:
        return "missing " + ", ".join(f"args.{name}" for name in missing)
    envs = args["test_envs"]
    if not isinstance(envs, list) or not all(type(e) is int for e in envs):
        return "args.test_envs is not a list of int"
    fraction = args.get("label_fraction")  # UDG jobs' (a number); NaN otherwise
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
        fraction = math.nan
    return _ArgValues(args["trial_seed"], args["dataset"], args["algorithm"], tuple(envs),
                      args["hparams_seed"], args.get("output_dir"), float(fraction),
                      tuple(compute_settings(args).items()) or math.nan,
                      _settings(args) or math.nan)


def _settings(args: dict) -> tuple:
    """``((name, value), ...)``: the :data:`SETTING_ARGS` given and not at their defaults (so
    absent and default compare equal), hashable; ``hparams`` as sorted JSON, ``{}`` as absent."""
    found = []
    for name in SETTING_ARGS:
        value = args.get(name)
        if name == "hparams" and isinstance(value, str):
            with suppress(ValueError):
                value = json.loads(value)
        if value is None or value == ROWS[name].default or (name == "hparams" and value == {}):
            continue
        found.append((name, tuple(value) if isinstance(value, list) else
                      json.dumps(value, sort_keys=True) if isinstance(value, dict) else value))
    return tuple(found)


class _Segment(NamedTuple):
    """``size`` consecutive rows of one job with the same ``args``, stored once."""

    job: str
    args: _ArgValues
    size: int
    environments: tuple | None


@dataclass(slots=True)
class _AccBlock:
    """The numbers of all records with one key set: keys, rows, values row-major."""

    keys: list[str]
    rows: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    get: Callable[[dict], tuple] = field(init=False)  # record -> its values of ``keys``

    def __post_init__(self) -> None:  # itemgetter gives a tuple for two keys or more
        self.get = (itemgetter(*self.keys) if len(self.keys) > 1 else
                    lambda record, keys=tuple(self.keys): tuple(record[k] for k in keys))

    def matrix(self) -> np.ndarray:
        return np.frombuffer(self.values, dtype=float).reshape(len(self.rows), len(self.keys))


class _Columns:
    """Records collected column by column, made into a DataFrame by :meth:`frame`."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.lines: list[int] = []
        self.steps: list = []
        self.hparams: list = []
        self.blocks: dict[tuple, _AccBlock] = {}
        self.problems: list[str] = []
        self.nonfinite: dict[int, tuple] = {}  # row -> its keys with a NaN/infinite value

    def add_file(self, job: str, path: str, text: str) -> None:
        """Add the records of one ``results.jsonl``; unusable lines become problems."""
        numbers, records, nonfinite = [], [], {}  # nonfinite: as self.nonfinite, by line
        fast = orjson.loads
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip(_JSON_SPACE):
                continue
            try:  # orjson rejects NaN and Infinity: a line it reads has none
                records.append(fast(line))
            except ValueError:
                try:
                    records.append(json.loads(line))
                except ValueError as error:
                    self.problems.append(f"skipping line {number} of {path}: not valid JSON "
                                         f"({error})")
                    continue
                if type(records[-1]) is dict:  # its non-finite top-level values
                    keys = tuple((key, "NaN" if value != value else str(value))
                                 for key, value in records[-1].items()
                                 if type(value) is float and not math.isfinite(value))
                    if keys:
                        nonfinite[number] = keys
            numbers.append(number)
        first = records[0] if records else None  # the usual case: valid, same keys and args
        if type(first) is dict and "step" in first and "args" in first:
            args, keys = first["args"], first.keys()
            values = _arg_values(args)
            if type(values) is not str and all(type(record) is dict and record.keys() == keys
                                               and record["args"] == args for record in records):
                self._append(job, numbers, records, values, nonfinite)
                return
        for number, record in zip(numbers, records):  # line by line
            args = _arg_values(record.get("args")) if type(record) is dict else "not a JSON object"
            if type(args) is not str and "step" not in record:
                args = "missing step"
            if type(args) is str:
                self.problems.append(f"skipping line {number} of {path}: {args}")
            else:
                self._append(job, [number], [record], args, nonfinite)

    def _append(self, job: str, numbers: list[int], records: list, args: _ArgValues,
                nonfinite: dict[int, tuple]) -> None:
        """Append valid records that share ``args`` and keys (``nonfinite``: by line number)."""
        keys = tuple(records[0])
        block = self.blocks.get(keys)
        if block is None:
            block = self.blocks[keys] = _AccBlock([k for k in keys if ACC_KEY.fullmatch(k)
                                                     or COUNT_KEY.fullmatch(k)
                                                     or k in NUMBER_KEYS])
        start = len(self.steps)
        if nonfinite:
            for row, number in enumerate(numbers, start):
                if number in nonfinite:
                    self.nonfinite[row] = nonfinite[number]
        block.rows.extend(range(start, start + len(records)))
        size = len(block.values)
        try:
            block.values.extend(chain.from_iterable(map(block.get, records)))
        except (TypeError, OverflowError):  # a non-numeric accuracy: keep what is numeric
            del block.values[size:]
            block.values.extend(map(_number, chain.from_iterable(map(block.get, records))))
        self.steps.extend(map(itemgetter("step"), records))
        self.hparams.extend(record.get("hparams") for record in records)
        self.lines.extend(numbers)
        labels = records[0].get("environments")  # kept when a list of strings
        environments = (tuple(labels) if isinstance(labels, list) and labels
                        and all(isinstance(v, str) for v in labels) else None)
        self.segments.append(_Segment(job, args, len(records), environments))

    def frame(self) -> pd.DataFrame:
        columns: dict[str, object] = {}
        sizes = np.array([segment.size for segment in self.segments], dtype=np.int64)
        args = list(zip(*(segment.args for segment in self.segments))) or [()] * len(ARG_COLUMNS)
        for name, values in zip(ARG_COLUMNS, args):
            # Seeds: let pandas infer (int64 normally); the rest stays Python objects.
            columns[name] = (pd.Series(list(values)).to_numpy().repeat(sizes)
                             if name.endswith("_seed") else _object_series(values, sizes))
        columns["step"] = self.steps
        columns["hparams"] = _object_series(self.hparams)
        columns["job"] = _object_series([segment.job for segment in self.segments], sizes)
        columns["environments"] = _object_series(
            [segment.environments for segment in self.segments], sizes)
        columns["line"] = np.array(self.lines, dtype=np.int64)
        columns["nonfinite"] = _object_series([self.nonfinite.get(row, math.nan)
                                               for row in range(len(self.steps))])
        acc_keys = sorted({key for block in self.blocks.values() for key in block.keys},
                          key=_acc_sort_key)
        position = {key: i for i, key in enumerate(acc_keys)}
        accs = np.full((len(self.steps), len(acc_keys)), np.nan)
        for block in self.blocks.values():
            if block.keys:
                where = [position[key] for key in block.keys]
                if len(block.rows) == len(accs):  # every record has these keys
                    accs[:, where] = block.matrix()
                else:
                    rows = np.frombuffer(block.rows, dtype=np.int64)
                    accs[np.ix_(rows, where)] = block.matrix()
        columns.update(zip(acc_keys, accs.T))
        return pd.DataFrame(columns)


def _object_series(values, repeats: np.ndarray | None = None) -> pd.Series:
    """A Series of Python objects, each repeated ``repeats[i]`` times (not pandas' strings)."""
    values = np.fromiter(values, dtype=object, count=len(values))
    if repeats is not None:
        values = values.repeat(repeats)
    return pd.Series(values, dtype=object, copy=False)


def _number(value) -> float:
    """An accuracy value as a float; NaN if it is not a number."""
    try:
        return float(value) if isinstance(value, (int, float)) else math.nan
    except OverflowError:
        return math.nan


def _acc_sort_key(key: str):
    for rank, pattern in enumerate((ACC_KEY, COUNT_KEY)):  # accuracies, then counts
        if (match := pattern.fullmatch(key)) is not None:
            return rank, int(match.group(1)), match.group(2)
    return 2, NUMBER_KEYS.index(key), ""  # the other numbers last


class JobProgress(NamedTuple):
    """A sweep's job folders: their count, and those without ``done`` (running or failed)."""

    total: int
    not_done: list[str]

    @property
    def done(self) -> int:
        return self.total - len(self.not_done)


def _job_folders(input_dir: str) -> list[str]:
    """The job folders of ``input_dir`` (md5-named or holding a job's files), sorted."""
    folders = ((entry, os.path.join(input_dir, entry)) for entry in sorted(os.listdir(input_dir)))
    return [entry for entry, folder in folders if os.path.isdir(folder) and (
        JOB_FOLDER_NAME.fullmatch(entry)
        or any(os.path.exists(os.path.join(folder, name)) for name in JOB_FILES))]


def job_progress(input_dir: str) -> JobProgress:
    """Count the job folders of ``input_dir`` and those done."""
    folders = _job_folders(input_dir)
    not_done = [entry for entry in folders if not is_done(os.path.join(input_dir, entry))]
    return JobProgress(len(folders), not_done)


#: Why a job folder has no record in the tables (:func:`folder_notes`), and what to do.
DONE_EMPTY = f"done, but its {RESULTS_FILE} is empty (the job wrote no record)"
DONE_ABSENT = f"done, but it has no {RESULTS_FILE}"
UNREADABLE = f"its {RESULTS_FILE} cannot be read"
UNUSABLE = f"no line of its {RESULTS_FILE} is a usable record"
_RELAUNCH = "delete the folder and relaunch the sweep to run the job again"
_LEFT_OUT_FIX = {DONE_EMPTY: _RELAUNCH, DONE_ABSENT: _RELAUNCH,
                 UNREADABLE: "make it readable, or delete the folder and relaunch the sweep",
                 UNUSABLE: "the warnings above name the bad lines"}


def folder_notes(input_dir: str, jobs) -> tuple[list[str], list[str]]:
    """The notes on ``input_dir``'s job folders: ``k of n jobs done (...)`` when some lacks
    ``done``; and one per reason naming the folders not in ``jobs`` (those with records) that have
    none: the results file cannot be read, holds no usable line, or is empty or absent although
    the job is done (a folder not done with no record yet is only counted)."""
    progress = job_progress(input_dir)
    shown = ", ".join(progress.not_done[:5]) + (", ..." if len(progress.not_done) > 5 else "")
    counted = [f"{progress.done} of {progress.total} jobs done ({len(progress.not_done)} running "
               f"or incomplete: {shown}); the tables use the records written so far"
               ] if progress.not_done else []
    found: dict[str, list[tuple[str, str]]] = {}  # reason -> (job, detail)
    for entry in [entry for entry in _job_folders(input_dir) if entry not in jobs]:
        folder = os.path.join(input_dir, entry)
        problems: list[str] = []
        text = _read_text(os.path.join(folder, RESULTS_FILE), problems)
        if problems:
            error = re.search(r"\[Errno \d+\] ([^:]+)", problems[0])  # strerror, no path
            found.setdefault(UNREADABLE, []).append((entry, error.group(1) if error else ""))
        elif text is not None and text.strip(_JSON_SPACE):
            lines = sum(1 for line in text.split("\n") if line.strip(_JSON_SPACE))
            found.setdefault(UNUSABLE, []).append((entry, f"{lines} line{'s' * (lines != 1)}"))
        elif is_done(folder):
            found.setdefault(DONE_ABSENT if text is None else DONE_EMPTY, []).append((entry, ""))
    notes = []
    for reason, folders in found.items():
        fix = _LEFT_OUT_FIX[reason]
        if len(folders) == 1:
            job, detail = folders[0]
            notes.append(f"job folder {job} is left out of the tables: {reason}"
                         f"{f' ({detail})' if detail else ''}; {fix}.")
        else:
            names = ", ".join(f"{job} ({detail})" if detail else job for job, detail in folders)
            notes.append(f"{len(folders)} job folders are left out of the tables, each {reason}: "
                         f"{names}; {fix.replace('the folder', 'each folder')}.")
    return counted, notes


def acc_width(records: pd.DataFrame) -> int:
    """One more than the largest environment index of any accuracy column (0 if none)."""
    matches = (ACC_KEY.fullmatch(column) for column in records.columns)
    return max((int(match.group(1)) + 1 for match in matches if match), default=0)


def acc_matrix(records: pd.DataFrame, key: str) -> np.ndarray:
    """``records[key.format(t=i)]`` for i < :func:`acc_width` as a (records x width) float
    array, NaN where absent; ``key`` is a template such as ``env{t}_out_acc``."""
    columns = [key.format(t=i) for i in range(acc_width(records))]
    return records.reindex(columns=columns).to_numpy(dtype=float, na_value=np.nan)
