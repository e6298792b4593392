"""Is a score file the right one for this run: the copy of the data it scored (a fingerprint of
paths and byte sizes) and the model that scored it (docs/methods/alignment.md)."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from dg_plugins.alignment.scores_file import ScoreTable

FINGERPRINT_KEY = "data_fingerprint"
#: The scorer's defaults (the authors' open_clip model, weights and prompt), torch-free here.
DEFAULT_MODEL, DEFAULT_PRETRAINED, DEFAULT_PROMPT = "ViT-B-16", "laion400m_e32", "A photo of {}."
#: The open_clip ``(model, pretrained tag)`` whose cosines a named rule's cuts are made for.
PRESET_MODELS: dict[str, tuple[str, str]] = {"teterwak2025": (DEFAULT_MODEL, DEFAULT_PRETRAINED)}
RESCORE = "python -m dg_plugins.scripts.alignment_scores"


def fingerprint(paths, sizes) -> str:
    """The data fingerprint of one environment: sha256 of its sorted ``path<TAB>size`` lines."""
    lines = "".join(f"{path}\t{size}\n" for path, size in sorted(zip(paths, map(int, sizes))))
    return hashlib.sha256(lines.encode()).hexdigest()


def file_sizes(abs_paths) -> np.ndarray:
    return np.asarray([os.stat(p).st_size for p in abs_paths], dtype=np.int64)


def table_fingerprints(envs, paths, sizes) -> dict[str, str]:
    """``{str(env): fingerprint}`` of rows given as parallel ``envs`` / ``paths`` / ``sizes``."""
    envs, paths, sizes = (np.asarray(a) for a in (envs, paths, sizes))
    return {str(int(env)): fingerprint(paths[envs == env].tolist(), sizes[envs == env].tolist())
            for env in sorted(set(envs.tolist()))}


def items_fingerprints(items) -> dict[str, str]:
    """Fingerprints of :func:`~dg_plugins.alignment.wrapper.image_items` rows, for the header."""
    return table_fingerprints(items["env"].to_numpy(), items["path"].to_numpy(),
                              file_sizes(items["abs_path"].tolist()))


def where(table: ScoreTable) -> str:
    return f"alignment score file {table.path!r}" if table.path else "alignment scores"


def check_data(table: ScoreTable, env: int, env_name, file_paths, abs_paths,
               data_dir: str | None) -> str | None:
    """Raise ValueError when the header's fingerprint of ``env`` differs from the matched images;
    a warning when the file has none (None when it matches)."""
    recorded = table.meta.get(FINGERPRINT_KEY)
    expected = recorded.get(str(env)) if isinstance(recorded, dict) else None
    if not isinstance(expected, str):
        return (f"{where(table)} records no data fingerprint for environment {env} (written "
                "by an older dg_plugins or by hand), so it cannot be checked against the data in "
                f"{os.path.abspath(data_dir) if data_dir else 'use'}; re-score with {RESCORE} to "
                "make it checkable")
    here = fingerprint(list(file_paths), file_sizes(abs_paths).tolist())
    if here == expected:
        return None
    scored_in = table.meta.get("data_dir") or "an unrecorded folder"
    now = os.path.abspath(data_dir) if data_dir else "the dataset's folder"
    dataset = table.meta.get("dataset") or "DATASET"
    raise ValueError(
        f"{where(table)} was made for another copy of the data: the images of environment {env} "
        f"({env_name}) have other byte sizes than the ones it scored (scored in {scored_in}; this "
        f"run reads {now}), so its scores belong to other image files. Re-score this copy: "
        f"{RESCORE} --dataset {dataset} --data_dir {data_dir or 'DATA_DIR'} --out NEW_SCORES.csv")


def _norm_model(name) -> str:
    return str(name).replace("/", "-").lower()


def check_model(table: ScoreTable, preset: str | None = None, model: str | None = None,
                pretrained: str | None = None) -> None:
    """Raise ValueError when another model than ``preset``'s or ``model``/``pretrained`` scored."""
    wanted = []
    if preset in PRESET_MODELS:
        wanted.append((f"the rule --alignment_preset {preset}", *PRESET_MODELS[preset]))
    if model is not None or pretrained is not None:
        wanted.append(("the expected model (--alignment_model / --alignment_pretrained)",
                       model, pretrained))
    meta = table.meta
    have_model, have_pretrained = meta.get("model"), meta.get("pretrained")
    tags = {str(t).lower() for t in (have_pretrained, meta.get("pretrained_tag")) if t}
    for who, want_model, want_tag in wanted:
        if have_model is None:
            problem = "its header does not say which model scored it"
        elif want_model is not None and _norm_model(have_model) != _norm_model(want_model):
            problem = f"it was scored by {have_model} / {have_pretrained}"
        elif want_tag is not None and str(want_tag).lower() not in tags:
            problem = f"it was scored by {have_model} / {have_pretrained}"
            if meta.get("pretrained_sha256"):
                problem += " (a checkpoint file not declared to hold those weights)"
        else:
            continue
        want = " / ".join(str(v) for v in (want_model, want_tag) if v is not None)
        fix_model = f" --model {want_model}" if want_model else ""
        fix_tag = f" --pretrained {want_tag}" if want_tag else ""
        declared = (f" (or, with a local checkpoint of those weights, --pretrained FILE "
                    f"--pretrained_tag {want_tag})" if want_tag else "")
        raise ValueError(f"{where(table)} does not fit {who}, which needs scores of {want}: "
                         f"{problem}. Re-score with {RESCORE} --dataset "
                         f"{meta.get('dataset') or 'DATASET'} --data_dir DATA_DIR{fix_model}"
                         f"{fix_tag}{declared}")
