"""Where scores are stored (docs/methods/alignment.md): the alignment score file, the contract
between the scorer, ``train --alignment_scores`` and ``alignment_eval`` (a CSV with a JSON header,
one row per image), and :class:`ScoreCache`, the scorer's persistent cache, one file per scoring
setting, checked by a digest (a corrupt file is reported, ignored and overwritten), atomic."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import sys
import zipfile
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dg_plugins.files import atomic_write_bytes, atomic_write_text

MAGIC = "dg_plugins alignment scores v1"
REQUIRED_COLUMNS = ("env", "path", "label", "score")
COLUMNS = ("env", "env_name", "path", "label", "class", "score")
SUBSET_VALUES = ("ip", "oop", "drop")
#: A cosine of float32 unit vectors may exceed 1 by a few ulps; scores beyond 1 + this are errors.
SCORE_SLACK = 1e-5
#: What a score file is, for error messages about files that are not one.
WHAT_IT_IS = ("a score file is the text CSV written by python -m "
              f"dg_plugins.scripts.alignment_scores ('# {MAGIC}' header lines, then the columns "
              "env,env_name,path,label,class,score, one row per image)")
#: The start of a binary file read as a score file, and what to say about it.
_KNOWN_BINARIES = {
    b"\x93NUMPY": " It is a NumPy array: to import the authors' released .npy score arrays use "
                  "alignment_scores --import_score_arrays DIR.",
    b"PK": " It is a zip archive (e.g. a .npz score cache file).",
    b"\x1f\x8b": " It is gzip-compressed: decompress it first.",
}


@dataclass
class ScoreTable:
    """A score file in memory: ``frame`` (the rows) and ``meta`` (the header)."""

    frame: pd.DataFrame
    meta: dict = field(default_factory=dict)
    path: str | None = None

    @property
    def fixed_subsets(self) -> bool:
        return "subset" in self.frame.columns


def write_scores(path: str, frame: pd.DataFrame, meta: dict | None = None) -> None:
    """Write ``frame`` (:data:`COLUMNS`, then any other) with ``meta`` as header, atomically."""
    if missing := [c for c in REQUIRED_COLUMNS if c not in frame.columns]:
        raise ValueError(f"score table lacks columns {missing}")
    ordered = [c for c in COLUMNS if c in frame.columns]
    ordered += [c for c in frame.columns if c not in ordered]
    lines = [f"# {MAGIC}"]
    for key, value in (meta or {}).items():
        if "\n" in key or ":" in key:
            raise ValueError(f"header key {key!r} may not contain ':' or a newline")
        lines.append(f"# {key}: {json.dumps(value)}")
    body = frame[ordered].to_csv(index=False, float_format="%.9g", lineterminator="\n")
    atomic_write_text(path, "\n".join(lines) + "\n" + body)


def read_scores(path: str) -> ScoreTable:
    """Read a score file; a malformed one raises ValueError naming the file and the problem."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"alignment score file {path!r} does not exist; write one with "
                                "python -m dg_plugins.scripts.alignment_scores")
    with open(path, "rb") as f:  # UTF-8 text, not a binary file?
        head = f.read(1 << 16)
    problem = "it holds binary data (NUL bytes)" if b"\0" in head else None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if problem is None and err.start < len(head) - 4:  # not just a cut at the block's end
            problem = f"it is not UTF-8 text (byte {err.start} cannot be decoded)"
    if problem is not None:
        hint = next((text for magic, text in _KNOWN_BINARIES.items() if head.startswith(magic)),
                    "")
        raise ValueError(f"alignment score file {path!r} is not a score file: {problem}; "
                         f"{WHAT_IT_IS}.{hint}")
    try:
        with open(path, encoding="utf-8") as f:
            header = list(itertools.takewhile(lambda line: line.startswith("#"), f))
    except UnicodeDecodeError as err:
        raise ValueError(f"alignment score file {path!r} is not UTF-8 text ({err}); "
                         f"{WHAT_IT_IS}") from None
    meta, header_lines = {}, len(header)
    for line in header:  # "# key: JSON value" (the magic line has no colon)
        key, sep, raw = (part.strip() for part in line[1:].partition(":"))
        if sep:
            try:
                meta[key] = json.loads(raw)
            except json.JSONDecodeError:
                meta[key] = raw
    try:
        frame = pd.read_csv(path, skiprows=header_lines, keep_default_na=False,
                            dtype={"path": str, "env_name": str, "class": str, "subset": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ValueError(f"alignment score file {path!r} is not a readable CSV ({err}); "
                         f"{WHAT_IT_IS}") from None
    if missing := [c for c in REQUIRED_COLUMNS if c not in frame.columns]:
        raise ValueError(f"alignment score file {path!r} lacks the columns {missing} (has "
                         f"{list(frame.columns)}); it must be written by "
                         "dg_plugins.scripts.alignment_scores")
    try:
        frame["env"] = frame["env"].astype(np.int64)
        frame["label"] = frame["label"].astype(np.int64)
        frame["score"] = pd.to_numeric(frame["score"].replace("", np.nan), errors="raise"
                                       ).astype(np.float64)
    except (ValueError, TypeError) as err:
        raise ValueError(f"alignment score file {path!r}: bad env/label/score value ({err})"
                         ) from None
    if "subset" in frame.columns:
        if bad := sorted(set(frame["subset"]) - set(SUBSET_VALUES)):
            raise ValueError(f"alignment score file {path!r}: subset values {bad} are not among "
                             f"{list(SUBSET_VALUES)}")
    elif frame["score"].isna().any():
        raise ValueError(f"alignment score file {path!r}: {int(frame['score'].isna().sum())} rows "
                         "have no score and the file has no 'subset' column")
    scores = frame["score"].to_numpy()
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(np.isinf(scores) | (np.abs(scores) > 1 + SCORE_SLACK))
    if len(bad):  # not cosines in [-1, 1]
        first_row_line = header_lines + 2  # the header lines, the column names, then the rows
        shown = ", ".join(f"line {first_row_line + int(i)}: {float(scores[i])!r}" for i in bad[:10])
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise ValueError(f"alignment score file {path!r}: {len(bad)} scores lie outside [-1, 1] "
                         f"({shown}{more}); an AlignmentScore is a cosine. The file was not "
                         "written by alignment_scores or was edited: re-score with python -m "
                         "dg_plugins.scripts.alignment_scores")
    duplicated = frame.duplicated(["env", "path"])
    if duplicated.any():
        first = frame[duplicated].iloc[0]
        raise ValueError(f"alignment score file {path!r}: image {first['path']!r} of env "
                         f"{first['env']} appears more than once")
    return ScoreTable(frame, meta, path)


#: The format of a score cache file (:class:`ScoreCache`).
CACHE_FORMAT_VERSION = 1


def default_cache_dir() -> str:
    base = os.environ.get("DG_PLUGINS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dg_plugins")
    return os.path.join(base, "alignment")


def image_key(path: str, class_name: str, st: os.stat_result | None = None) -> str:
    """The cache key of one image: absolute path, size, mtime (ns) and the prompt's class."""
    st = st if st is not None else os.stat(path)
    return f"{path}\t{st.st_size}\t{st.st_mtime_ns}\t{class_name}"


def _payload_digest(keys_blob: bytes, scores: np.ndarray) -> str:
    return hashlib.sha256(keys_blob + np.ascontiguousarray(scores, dtype="<f4").tobytes()
                          ).hexdigest()


class ScoreCache:
    """The scores of one setting: ``lookup(keys)``, ``update(keys, scores)``, ``save()``;
    ``status`` after :meth:`load`: absent, loaded or corrupt."""

    def __init__(self, setting: dict, cache_dir: str | None = None):
        self.setting = json.loads(json.dumps(setting, sort_keys=True, default=str))
        self.cache_dir = cache_dir or default_cache_dir()
        blob = json.dumps(self.setting, sort_keys=True, separators=(",", ":"), default=str)
        self.path = os.path.join(self.cache_dir, hashlib.sha256(blob.encode()).hexdigest()[:24]
                                 + ".npz")
        self.problem = ""
        self.load()

    def load(self) -> None:
        self.entries, self.dirty = {}, False
        if not os.path.exists(self.path):
            self.status = "absent"
            return
        try:
            with np.load(self.path, allow_pickle=False) as data:
                version = int(data["version"])
                setting = json.loads(bytes(data["setting"]).decode())
                keys_blob = bytes(data["keys"])
                scores = np.asarray(data["scores"], dtype=np.float32)
                digest = bytes(data["digest"]).decode()
            if version != CACHE_FORMAT_VERSION:
                raise ValueError(f"format version {version}, expected {CACHE_FORMAT_VERSION}")
            if setting != self.setting:
                raise ValueError("its stored setting differs from the file name's")
            if digest != _payload_digest(keys_blob, scores):
                raise ValueError("its checksum does not match its content")
            keys = keys_blob.decode().split("\n") if keys_blob else []
            if len(keys) != len(scores):
                raise ValueError(f"{len(keys)} keys for {len(scores)} scores")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:  # decoding too
            self.status, self.problem, self.dirty = "corrupt", str(err) or type(err).__name__, True
            print(f"warning: alignment score cache {self.path} is corrupt ({self.problem}); "
                  "ignoring it and recomputing its scores (it will be overwritten)",
                  file=sys.stderr)
            return
        self.entries = dict(zip(keys, scores.tolist()))
        self.status = "loaded"

    def lookup(self, keys: list[str]) -> np.ndarray:
        """Scores of ``keys`` (NaN where not cached)."""
        return np.asarray([self.entries.get(k, np.nan) for k in keys], dtype=np.float64)

    def update(self, keys, scores) -> None:
        self.entries.update(zip(keys, np.asarray(scores, dtype=np.float32).tolist()))
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        keys = list(self.entries)
        if any("\n" in k for k in keys):
            raise ValueError("image paths with newlines cannot be cached")
        keys_blob = "\n".join(keys).encode()
        scores = np.asarray([self.entries[k] for k in keys], dtype="<f4")
        buffer = io.BytesIO()
        np.savez(buffer, version=np.int64(CACHE_FORMAT_VERSION),
                 setting=np.frombuffer(json.dumps(self.setting, sort_keys=True).encode(),
                                       dtype=np.uint8),
                 keys=np.frombuffer(keys_blob, dtype=np.uint8), scores=scores,
                 digest=np.frombuffer(_payload_digest(keys_blob, scores).encode(),
                                      dtype=np.uint8))
        atomic_write_bytes(self.path, buffer.getvalue())
        self.dirty = False
        self.status = "loaded"
