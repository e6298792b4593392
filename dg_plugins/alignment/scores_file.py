"""The alignment score file: the contract between the scorer, ``train --alignment_scores`` and the
evaluation-only command.

A CSV (UTF-8, ``\\n`` line ends) whose first lines are a self-describing header, each ``# key:
value`` with the value JSON-encoded, then one row per image::

    # dg_plugins alignment scores v1
    # dataset: "PACS"
    # model: "ViT-B-16"
    # pretrained: "laion400m_e32"
    # pretrained_sha256: null
    # prompt: "A photo of {}."
    # transform: "dataset-eval: Compose(Resize(size=(224, 224), ...), ToTensor(), Normalize(...))"
    # data_dir: "/abs/path/when/scored"
    env,env_name,path,label,class,score
    0,art_painting,PACS/art_painting/dog/pic_001.jpg,0,dog,0.231804

Columns (required: ``env``, ``path``, ``label``, ``score``):

* ``env``: environment index in the dataset (its position, as ``--test_envs`` counts);
* ``env_name``: the environment's folder name (checked against the dataset when present);
* ``path``: the image path relative to ``--data_dir``, with ``/`` separators, so that a file is
  portable between machines;
* ``label``: the class index the dataset gives the image; ``class``: the class folder name (the
  word in the prompt). When both the file and the dataset name classes, names are compared, so a
  file stays valid for DomainBed's per-domain class indices;
* ``score``: the AlignmentScore, the raw cosine in [-1, 1] (empty when unknown, e.g. imported
  split folders);
* ``subset`` (optional): a fixed ``ip`` / ``oop`` / ``drop`` assignment (imported release splits);
  when present it is used as is and no threshold or preset applies.

Header keys written by the scorer: ``dataset``, ``model``, ``pretrained`` (tag, checkpoint path,
or ``none`` for random initialisation), ``pretrained_sha256`` (for a checkpoint file), ``seed``
(random initialisation only), ``prompt``, ``transform``, ``data_dir``, ``created``, ``open_clip``
(version); importers write ``source``. Unknown keys are kept, and files without a header are read.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dg_plugins.files import atomic_write_text

MAGIC = "dg_plugins alignment scores v1"
REQUIRED_COLUMNS = ("env", "path", "label", "score")
COLUMNS = ("env", "env_name", "path", "label", "class", "score")
SUBSET_VALUES = ("ip", "oop", "drop")


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
    """Write ``frame`` (columns :data:`COLUMNS`, plus ``subset`` and any extra) with ``meta`` as
    the header, atomically."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"score table lacks columns {missing}")
    ordered = [c for c in COLUMNS if c in frame.columns]
    ordered += [c for c in frame.columns if c not in ordered]
    lines = [f"# {MAGIC}"]
    for key, value in (meta or {}).items():
        if "\n" in key or ":" in key:
            raise ValueError(f"header key {key!r} may not contain ':' or a newline")
        lines.append(f"# {key}: {json.dumps(value)}")
    body = io.StringIO()
    frame[ordered].to_csv(body, index=False, float_format="%.9g", lineterminator="\n")
    atomic_write_text(path, "\n".join(lines) + "\n" + body.getvalue())


def read_scores(path: str) -> ScoreTable:
    """Read a score file; a malformed one raises ValueError naming the file and the problem."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"alignment score file {path!r} does not exist; write one with "
                                "python -m dg_plugins.scripts.alignment_scores")
    meta, header_lines = {}, 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            header_lines += 1
            text = line[1:].strip()
            if text == MAGIC or not text:
                continue
            key, sep, raw = text.partition(":")
            if not sep:
                continue
            try:
                meta[key.strip()] = json.loads(raw.strip())
            except json.JSONDecodeError:
                meta[key.strip()] = raw.strip()
    try:
        frame = pd.read_csv(path, skiprows=header_lines, keep_default_na=False,
                            dtype={"path": str, "env_name": str, "class": str, "subset": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ValueError(f"alignment score file {path!r} is not a readable CSV: {err}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
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
        bad = sorted(set(frame["subset"]) - set(SUBSET_VALUES))
        if bad:
            raise ValueError(f"alignment score file {path!r}: subset values {bad} are not among "
                             f"{list(SUBSET_VALUES)}")
    elif frame["score"].isna().any():
        raise ValueError(f"alignment score file {path!r}: {int(frame['score'].isna().sum())} rows "
                         "have no score and the file has no 'subset' column")
    duplicated = frame.duplicated(["env", "path"])
    if duplicated.any():
        first = frame[duplicated].iloc[0]
        raise ValueError(f"alignment score file {path!r}: image {first['path']!r} of env "
                         f"{first['env']} appears more than once")
    return ScoreTable(frame, meta, path)
