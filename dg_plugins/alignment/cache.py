"""A persistent cache of alignment scores, one file per scoring setting, checked by a digest
(a corrupt file is reported, ignored and overwritten); written atomically
(docs/methods/alignment.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import zipfile

import numpy as np

from dg_plugins.files import atomic_write_bytes

FORMAT_VERSION = 1


def default_cache_dir() -> str:
    base = os.environ.get("DG_PLUGINS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dg_plugins")
    return os.path.join(base, "alignment")


def image_key(path: str, class_name: str, st: os.stat_result | None = None) -> str:
    """The cache key of one image: absolute path (``path`` must be absolute), size, mtime (ns)
    and the prompt's class (``st``: the file's ``os.stat``, when already made)."""
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
            if version != FORMAT_VERSION:
                raise ValueError(f"format version {version}, expected {FORMAT_VERSION}")
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
        get = self.entries.get
        return np.asarray([get(k, np.nan) for k in keys], dtype=np.float64)

    def update(self, keys, scores) -> None:
        for key, score in zip(keys, np.asarray(scores, dtype=np.float32).tolist()):
            self.entries[key] = score
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
        np.savez(buffer, version=np.int64(FORMAT_VERSION),
                 setting=np.frombuffer(json.dumps(self.setting, sort_keys=True).encode(),
                                       dtype=np.uint8),
                 keys=np.frombuffer(keys_blob, dtype=np.uint8), scores=scores,
                 digest=np.frombuffer(_payload_digest(keys_blob, scores).encode(),
                                      dtype=np.uint8))
        atomic_write_bytes(self.path, buffer.getvalue())
        self.dirty = False
        self.status = "loaded"
