"""Published numbers of the papers dg_plugins implements (``paper_numbers.json`` beside this
module), read and checked by :func:`load` for ``collect_results --paper KEY``. Torch-free.

An entry (:class:`PaperEntry`) is one table of one paper in one setting: its citation
(``paper``, ``table``), what the numbers were copied from (``read_from``, ``source_kind``), the
collect_results tables it sits beside (``setting``: ``multi_source``, ``single_source`` with its
``source``, ``udg`` or ``ipoop``), one ``dataset`` (environment columns and ``Avg``) or several
``datasets`` (one average each), the ``selection`` it compares with (null: every one), the
``columns`` (our key -> the paper's), the ``rows`` (a value is ``mean`` or ``[mean, pm]``), the
rows that are ``ours`` (paper row -> our algorithm), a ``claim`` when there are no numbers, and
``notes``. A missing or malformed file raises :class:`PaperNumbersError` naming entry and field.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache

#: The JSON file shipped with the package (package data in ``setup.cfg``).
PAPER_NUMBERS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "paper_numbers.json")
#: Which kind of collect_results table an entry belongs beside.
SETTINGS = ("multi_source", "single_source", "udg", "ipoop")
#: What the numbers were copied from.
SOURCE_KINDS = ("full paper", "summary", "spec transcription")
#: The column key of a table's average column.
AVG = "Avg"
_TEXT_FIELDS = ("paper", "table", "read_from", "source_kind", "setting", "selection_note",
                "backbone", "metric")


class PaperNumbersError(ValueError):
    """The paper-numbers file is missing, not JSON, or an entry is malformed."""


@dataclass(frozen=True)
class PaperValue:
    """A published accuracy in percent, with the ``±`` the paper prints (None if none)."""

    mean: float
    pm: float | None = None

    def text(self, sign: str = "+/-") -> str:
        """As the paper prints it, less trailing zeros: one decimal, or two where it gives two
        (``72.61``), with ``sign`` before the ``±`` value."""
        mean = _decimals(self.mean)
        return mean if self.pm is None else f"{mean} {sign} {_decimals(self.pm)}"


def _decimals(value: float) -> str:
    return f"{value:.1f}" if round(value, 1) == value else f"{value:.2f}"


@dataclass(frozen=True)
class PaperEntry:
    """One entry of ``paper_numbers.json`` (field meanings: module docstring)."""

    key: str
    paper: str
    table: str
    read_from: str
    source_kind: str
    setting: str
    datasets: tuple[str, ...]
    per_dataset: bool  # True: a "dataset" entry (environment columns); False: "datasets"
    selection: str | None
    selection_note: str
    backbone: str
    metric: str
    pm: str | None
    columns: dict[str, str]
    rows: dict[str, dict[str, PaperValue]]
    ours: dict[str, str]
    source: str | None = None
    claim: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        """Whether the sources we have give any number for this entry."""
        return bool(self.rows)

    def paper_row(self, algorithm: str) -> str | None:
        """The paper row that ``algorithm`` corresponds to, if any."""
        return next((row for row, ours in self.ours.items() if ours == algorithm), None)

    def citation(self) -> str:
        """``<paper>, <table>``."""
        return f"{self.paper}, {self.table}"


def _fail(key: str, message: str) -> PaperNumbersError:
    return PaperNumbersError(f"paper numbers entry {key!r}: {message} ({PAPER_NUMBERS_FILE})")


def _value(key: str, row: str, column: str, raw) -> PaperValue:
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if number(raw):
        return PaperValue(float(raw))
    if isinstance(raw, list) and len(raw) == 2 and all(number(x) for x in raw):
        return PaperValue(float(raw[0]), float(raw[1]))
    raise _fail(key, f"row {row!r}, column {column!r}: {raw!r} is neither a number nor [mean, pm]")


def _entry(key: str, raw: dict) -> PaperEntry:
    if not isinstance(raw, dict):
        raise _fail(key, "not a JSON object")
    for name in _TEXT_FIELDS:
        if not isinstance(raw.get(name), str) or not raw[name]:
            raise _fail(key, f"field {name!r} must be a non-empty string")
    for name, choices in (("setting", SETTINGS), ("source_kind", SOURCE_KINDS)):
        if raw[name] not in choices:
            raise _fail(key, f"{name} {raw[name]!r} is not one of {', '.join(choices)}")
    if ("dataset" in raw) == ("datasets" in raw):
        raise _fail(key, "give exactly one of 'dataset' (one dataset, environment columns) and "
                         "'datasets' (several, one average each)")
    datasets = (raw["dataset"],) if "dataset" in raw else tuple(raw["datasets"])
    if not datasets or not all(isinstance(d, str) and d for d in datasets):
        raise _fail(key, "dataset names must be non-empty strings")
    selection = raw.get("selection")
    if selection is not None and (not isinstance(selection, str) or not selection):
        raise _fail(key, "selection must be a --selection key or null")
    columns, rows, ours = raw.get("columns"), raw.get("rows"), raw.get("ours")
    if not all(isinstance(x, dict) for x in (columns, rows, ours)):
        raise _fail(key, "columns, rows and ours must be JSON objects")
    if not ("dataset" in raw or set(columns) <= set(datasets)):
        raise _fail(key, f"columns {sorted(set(columns) - set(datasets))} are not in datasets")
    values = {}
    for row, cells in rows.items():
        if not isinstance(cells, dict) or not cells:
            raise _fail(key, f"row {row!r} must map columns to values")
        if unknown := sorted(set(cells) - set(columns)):
            raise _fail(key, f"row {row!r} has columns {unknown} missing from 'columns'")
        values[row] = {column: _value(key, row, column, cells[column])
                       for column in columns if column in cells}
    if unknown := sorted(set(ours) - set(rows)):
        raise _fail(key, f"'ours' names rows {unknown} that 'rows' lacks")
    claim = raw.get("claim")
    if not rows and not isinstance(claim, str):
        raise _fail(key, "an entry without numbers must say what its source claims ('claim')")
    source = raw.get("source")
    if source is not None and raw["setting"] != "single_source":
        raise _fail(key, "'source' applies to single_source entries only")
    notes = raw.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _fail(key, "notes must be a list of strings")
    return PaperEntry(
        key=key, **{name: raw[name] for name in _TEXT_FIELDS}, datasets=datasets,
        per_dataset="dataset" in raw, selection=selection, pm=raw.get("pm"), columns=dict(columns),
        rows=values, ours=dict(ours), source=source, claim=claim, notes=tuple(notes))


def load(path: str | None = None) -> dict[str, PaperEntry]:
    """Every entry of the paper-numbers file (default :data:`PAPER_NUMBERS_FILE`), by key, in
    file order; the default file is read once per process."""
    return dict(_load(os.path.abspath(path or PAPER_NUMBERS_FILE)))


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[tuple[str, PaperEntry], ...]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise PaperNumbersError(f"paper numbers file {path} is missing (a broken install? it "
                                "ships with dg_plugins as package data)") from None
    except ValueError as error:
        raise PaperNumbersError(f"paper numbers file {path} is not valid JSON: {error}") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise PaperNumbersError(f"paper numbers file {path} has no 'entries' object")
    return tuple((key, _entry(key, raw)) for key, raw in entries.items())


def keys() -> list[str]:
    """The entry keys, in file order."""
    return list(load())


def unknown_key_message(key: str, known: list[str] | None = None) -> str:
    """``unknown paper key 'x'; did you mean 'y'? known keys: ...``."""
    known = keys() if known is None else known
    close = list(dict.fromkeys([k for k in known if k.startswith(key) or key.startswith(k)]
                               + difflib.get_close_matches(key, known, n=3, cutoff=0.5)))[:3]
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    return f"unknown paper key {key!r}{hint}; known keys: {', '.join(known)}"


class UnknownPaperKeyError(LookupError):
    """A key that ``paper_numbers.json`` lacks; the message lists the close ones and all keys."""


def get(key: str) -> PaperEntry:
    """The entry ``key``; raises :class:`UnknownPaperKeyError` ("did you mean") otherwise."""
    entries = load()
    if key not in entries:
        raise UnknownPaperKeyError(unknown_key_message(key, list(entries)))
    return entries[key]
