"""Import the authors' released IP/OOP material into a score file (Teterwak et al., ICLR 2025):
per-split score arrays, or per-image split folders, each read as documented
(docs/methods/alignment.md)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from dg_plugins.alignment.provenance import FINGERPRINT_KEY, items_fingerprints
from dg_plugins.alignment.scores_file import ScoreTable
from dg_plugins.alignment.wrapper import env_folder_name, image_items, relative_path
from dg_plugins.layouts import list_images
from dg_plugins.seeds import seed_hash

AUTHORS_SETTING = {"model": "ViT-B-16", "pretrained": "laion400m_e32",
                   "prompt": "A photo of {}.",
                   "transform": "DomainBed eval (Resize((224, 224)), ToTensor, ImageNet "
                                "Normalize), as the authors' evaluator"}


def _imported(dataset, dataset_name, frames, data_dir, source: str) -> ScoreTable:
    """The table of the imported ``frames`` (image items with ``abs_path``)."""
    meta = {"dataset": dataset_name or type(dataset).__name__, **AUTHORS_SETTING,
            "source": source, "data_dir": os.path.abspath(data_dir) if data_dir else None,
            FINGERPRINT_KEY: {k: v for f in frames for k, v in items_fingerprints(f).items()}}
    frame = pd.concat(frames, ignore_index=True).drop(columns=["abs_path"])
    return ScoreTable(frame, meta)


def _load_rows(path: str) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read score array {path!r}: {err}") from None
    array = np.asarray(array, dtype=np.float64)
    if array.ndim == 1:
        array = np.stack([array, np.full(len(array), np.nan)], axis=1)
    if array.ndim != 2 or array.shape[1] < 1 or not np.isfinite(array[:, 0]).all():
        raise ValueError(f"score array {path!r} has shape {array.shape}; expected rows of "
                         "(score, is_correct) with finite scores")
    return array


def import_score_arrays(dataset, folder: str, data_dir: str | None, envs=None,
                        holdout_fraction: float = 0.2, trial_seed: int = 0,
                        dataset_name: str | None = None) -> ScoreTable:
    """A score table from ``<folder>/<domain>_in.npy`` and ``_out.npy``
    (docs/methods/alignment.md). ``envs`` default: every environment whose two files exist."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"score array folder {folder!r} does not exist")
    frames = []
    for env_index in range(len(dataset)) if envs is None else [int(e) for e in envs]:
        name = env_folder_name(dataset[env_index]) or str(env_index)
        paths = {s: os.path.join(folder, f"{name}_{s}.npy") for s in ("in", "out")}
        present = {s: os.path.exists(p) for s, p in paths.items()}
        if not any(present.values()):
            if envs is not None:
                raise FileNotFoundError(f"no score arrays for environment {env_index}: expected "
                                        f"{paths['in']} and {paths['out']}")
            continue
        if not all(present.values()):
            lacking = [p for s, p in paths.items() if not present[s]]
            raise FileNotFoundError(f"environment {env_index} ({name}): {lacking[0]} is missing "
                                    "(both the in and the out array are needed to cover the "
                                    "domain)")
        items = image_items(dataset, [env_index], data_dir)
        order = np.random.RandomState(seed_hash(trial_seed, env_index)).permutation(len(items))
        n_out = int(len(items) * holdout_fraction)  # the in split, then the out split
        rows = {s: _load_rows(p) for s, p in paths.items()}
        scores, correct = np.empty(len(items)), np.empty(len(items))
        for split, keys in (("in", order[n_out:]), ("out", order[:n_out])):
            if len(rows[split]) != len(keys):
                raise ValueError(
                    f"{paths[split]} has {len(rows[split])} rows but the {split} split of "
                    f"environment {env_index} ({name}) has {len(keys)} images (domain of "
                    f"{len(items)} images, holdout_fraction {holdout_fraction}); the arrays were "
                    "made with another holdout fraction or another copy of the data")
            scores[keys] = rows[split][:, 0]
            correct[keys] = rows[split][:, 1] if rows[split].shape[1] > 1 else np.nan
        items["score"], items["reference_correct"] = scores, correct
        frames.append(items)
    if not frames:
        raise FileNotFoundError(f"no <domain>_in.npy / <domain>_out.npy score arrays in {folder} "
                                "for the domains "
                                f"{[env_folder_name(dataset[i]) for i in range(len(dataset))]}")
    return _imported(dataset, dataset_name, frames, data_dir,
                     f"imported score arrays from {os.path.abspath(folder)} (holdout_fraction "
                     f"{holdout_fraction}, trial_seed {trial_seed})")


def import_split_dirs(dataset, ip_dir: str, oop_dir: str, data_dir: str | None, envs=None,
                      dataset_name: str | None = None) -> ScoreTable:
    """A fixed-subset table from an IP and an OOP copy of the dataset (data_dirs or its folder)."""
    for folder in (ip_dir, oop_dir):
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"split folder {folder!r} does not exist")
    folders = [getattr(type(dataset), "FOLDER_NAME", None),  # where an env's folder may be
               os.path.basename(os.path.normpath(str(getattr(dataset, "root", "") or "")))]
    frames = []
    for env_index in range(len(dataset)) if envs is None else [int(e) for e in envs]:
        env = dataset[env_index]
        name = env_folder_name(env)
        env_root = getattr(env, "root", None)
        if name is None or env_root is None:
            raise ValueError(f"environment {env_index} has no folder (root); split folders can "
                             "only be matched to image-folder datasets")
        found = {}  # the environment's folder in the IP and in the OOP copy, if any
        for s, d in (("ip", ip_dir), ("oop", oop_dir)):
            candidates = [os.path.join(d, name)] + [os.path.join(d, f, name) for f in folders if f]
            found[s] = next((c for c in candidates if os.path.isdir(c)), None)
        if not any(found.values()):
            if envs is not None:
                raise FileNotFoundError(f"neither {ip_dir} nor {oop_dir} has a folder for "
                                        f"environment {env_index} ({name})")
            continue
        files = {s: {relative_path(p, f) for p in list_images(f)} if f else set()
                 for s, f in found.items()}
        both = files["ip"] & files["oop"]
        if both:
            raise ValueError(f"{len(both)} images of {name} are in both the IP and the OOP "
                             f"folder, e.g. {sorted(both)[:3]}")
        items = image_items(dataset, [env_index], data_dir)
        within = [relative_path(p, env_root) for p in items["abs_path"]]
        known = set(within)
        extra = (files["ip"] | files["oop"]) - known
        if extra:
            raise ValueError(f"{len(extra)} images of the split folders for {name} are not in "
                             f"this dataset, e.g. {sorted(extra)[:3]}; the split was made for "
                             "another copy of the data (or the class folders differ)")
        subset = np.where([w in files["ip"] for w in within], "ip",
                          np.where([w in files["oop"] for w in within], "oop", "drop"))
        items["score"] = np.nan
        items["subset"] = subset
        frames.append(items)
    if not frames:
        raise FileNotFoundError(f"no domain folders of this dataset under {ip_dir} or {oop_dir}")
    return _imported(dataset, dataset_name, frames, data_dir,
                     f"imported split folders IP={os.path.abspath(ip_dir)} "
                     f"OOP={os.path.abspath(oop_dir)}")
