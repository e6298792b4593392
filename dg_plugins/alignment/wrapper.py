"""Score rows matched to a dataset's images by path (docs/methods/alignment.md): the IP/OOP index
subsets of its target environments (:class:`AlignmentSplit`, and :func:`env_subsets`, which
``train --alignment_scores`` calls), and the authors' released IP/OOP material (Teterwak et al.,
ICLR 2025: per-split score arrays, or per-image split folders) imported as a score table."""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd

from dg_plugins.alignment import provenance
from dg_plugins.alignment.rule import (SUBSETS, SplitRule, lopsided_warnings, resolve_rule,
                                       subset_counts)
from dg_plugins.alignment.scores_file import ScoreTable, read_scores
from dg_plugins.layouts import list_images
from dg_plugins.seeds import seed_hash

_SHOW = 5  # examples shown in mismatch messages


def env_samples(env) -> list | None:
    """The ``(path, label)`` list of an environment, or None for one without image files."""
    samples = getattr(env, "samples", None)
    samples = getattr(env, "imgs", None) if samples is None else samples
    return None if samples is None else list(samples)


def env_folder_name(env) -> str | None:
    root = getattr(env, "root", None)
    return os.path.basename(os.path.normpath(str(root))) if root else None


def relative_path(path: str, data_dir: str | None) -> str:
    """``path`` relative to ``data_dir`` with ``/`` separators (as the score file stores it)."""
    path = os.path.normpath(os.path.abspath(path))
    if data_dir is not None:
        path = os.path.relpath(path, os.path.abspath(data_dir))
    return path.replace(os.sep, "/")


def no_paths_error(dataset, env_index: int) -> ValueError:
    return ValueError(
        f"environment {env_index} of {type(dataset).__name__} has no image paths (an in-memory "
        "dataset such as RotatedMNIST or Debug28?); IP/OOP alignment scores exist only for image "
        "datasets whose environments list their files (samples), e.g. PACS, VLCS, OfficeHome, "
        "TerraIncognita, DomainNet or ImageFolder")


def match_rows(table: ScoreTable, dataset, env_index: int, data_dir: str | None) -> np.ndarray:
    """Row positions (into ``table.frame``) of environment ``env_index``'s items, in item order."""
    frame, where = table.frame, provenance.where(table)
    if not 0 <= env_index < len(dataset):
        raise ValueError(f"environment {env_index} is out of range: the dataset has "
                         f"{len(dataset)} environments")
    env = dataset[env_index]
    samples = env_samples(env)
    if samples is None:
        raise no_paths_error(dataset, env_index)
    name = env_folder_name(env)
    positions = np.flatnonzero(frame["env"].to_numpy() == env_index)
    if len(positions) == 0:
        have = sorted(set(frame["env"].tolist()))
        raise ValueError(f"{where} has no scores for environment {env_index} ({name}); it scores "
                         f"environments {have}. Score it: python -m dg_plugins.scripts."
                         f"alignment_scores ... --envs {env_index}")
    if "env_name" in frame.columns and name is not None:
        names = set(frame["env_name"].to_numpy()[positions].tolist())
        if names != {name}:
            raise ValueError(f"{where}: environment {env_index} is {sorted(names)} in the file but "
                             f"{name!r} in the dataset; the file was made for another dataset or "
                             "another folder layout. Rescore this dataset")
    paths = frame["path"].to_numpy()[positions]
    lookup = {p: k for k, p in enumerate(paths)}
    depths = sorted({p.count("/") + 1 for p in paths}, reverse=True)
    matched = np.full(len(samples), -1, dtype=np.int64)
    mapper = _PathMapper(env, data_dir)
    for item, (path, _) in enumerate(samples):
        absolute, relative = mapper(path)
        k = lookup.get(relative) if data_dir is not None else None
        if k is None:  # the longest tail of the path that the file names
            parts = absolute.replace(os.sep, "/").split("/")
            k = next((lookup[tail] for tail in ("/".join(parts[-depth:]) for depth in depths)
                      if tail in lookup), None)
        matched[item] = -1 if k is None else k
    missing = np.flatnonzero(matched < 0)
    if len(missing):
        examples = [relative_path(samples[i][0], data_dir) for i in missing[:_SHOW]]
        raise ValueError(f"{where}: {len(missing)} of the {len(samples)} images of environment "
                         f"{env_index} ({name}) have no score, e.g. {examples}. The file was made "
                         "for other data (or another --data_dir); rescore this dataset with "
                         "python -m dg_plugins.scripts.alignment_scores")
    counts = np.bincount(matched, minlength=len(paths))
    if (counts > 1).any():
        raise ValueError(f"{where}: score rows of environment {env_index} match several images "
                         f"(e.g. {paths[np.flatnonzero(counts > 1)[0]]!r}); pass --data_dir so "
                         "that paths match exactly")
    if (counts == 0).any():
        extra = paths[np.flatnonzero(counts == 0)[:_SHOW]].tolist()
        raise ValueError(f"{where}: {int((counts == 0).sum())} scored images of environment "
                         f"{env_index} ({name}) are not in the dataset, e.g. {extra}; the file was "
                         "made for other data. Rescore this dataset")
    rows = positions[matched]
    labels = np.asarray([label for _, label in samples], dtype=np.int64)
    classes = getattr(env, "classes", None)
    by_class = "class" in frame.columns and classes is not None
    theirs = frame["class" if by_class else "label"].to_numpy()[rows]
    ours = np.asarray([classes[label] for label in labels], dtype=object) if by_class else labels
    differ = np.flatnonzero(theirs != ours)
    shown = repr if by_class else str
    what = [f"{paths[matched[i]]}: {shown(theirs[i])} in the file, {shown(ours[i])} in the "
            "dataset" for i in differ[:_SHOW]]
    if len(differ):
        raise ValueError(f"{where}: {len(differ)} images of environment {env_index} ({name}) have "
                         f"another class than in the dataset ({'; '.join(what)}); rescore this "
                         "dataset")
    return rows


class AlignmentSplit:
    """IP / OOP / dropped index subsets of the target environments ``envs`` of ``dataset``, from
    a score file under ``rule``; ``verify_data`` checks the fingerprints."""

    def __init__(self, dataset, scores, envs, rule: SplitRule | None = None,
                 data_dir: str | None = None, verify_data: bool = True):
        self.dataset = dataset
        self.table = scores if isinstance(scores, ScoreTable) else read_scores(scores)
        self.rule = None if self.table.fixed_subsets else (rule or SplitRule())
        self.envs = [int(e) for e in envs]
        self.assignment: dict[int, np.ndarray] = {}
        self.scores: dict[int, np.ndarray] = {}
        self.notes: list[str] = []  # provenance warnings (a file without data fingerprints)
        frame = self.table.frame
        for env in self.envs:
            rows = match_rows(self.table, dataset, env, data_dir)
            note = None if not verify_data else provenance.check_data(
                self.table, env, env_folder_name(dataset[env]), frame["path"].to_numpy()[rows],
                [path for path, _ in env_samples(dataset[env])], data_dir)
            if note is not None and not self.notes:  # one warning per file is enough
                self.notes.append(note)
            self.scores[env] = frame["score"].to_numpy()[rows]
            self.assignment[env] = frame["subset"].to_numpy()[rows].astype(object) \
                if self.rule is None else self.rule.assign(self.scores[env])

    def indices(self, env: int, subset: str) -> list[int]:
        if subset not in SUBSETS:
            raise ValueError(f"unknown subset {subset!r}; choose from {', '.join(SUBSETS)}")
        return np.flatnonzero(self.assignment[env] == subset).tolist()

    def subset(self, env: int, name: str):
        import torch.utils.data

        return torch.utils.data.Subset(self.dataset[env], self.indices(env, name))

    def subsets(self, names=("ip", "oop")) -> dict[int, dict[str, list[int]]]:
        return {env: {name: self.indices(env, name) for name in names} for env in self.envs}

    def counts(self, env: int) -> dict[str, int]:
        return subset_counts(self.assignment[env])

    def report(self) -> str:
        """A table of count and fraction of IP / OOP / dropped images per environment."""
        source = self.table.meta.get("source", "the file's subset column")
        rule = f"fixed subsets from {source}" if self.rule is None else self.rule.describe()
        row = "  {:<4} {:<20} {:>7} {:>15} {:>15} {:>15}".format  # one row of the table
        lines = [f"IP/OOP split ({rule}):", row("env", "name", "images", "IP", "OOP", "dropped")]
        for env in self.envs:
            counts = self.counts(env)
            total = sum(counts.values())
            cells = [f"{counts[n]} ({100 * counts[n] / total if total else 0:.1f}%)"
                     for n in SUBSETS]
            lines.append(row(env, env_folder_name(self.dataset[env]) or "-", total, *cells))
        return "\n".join(lines)

    def warnings(self) -> list[str]:
        out = list(self.notes)
        if self.rule is None:
            return out
        for env in self.envs:
            name = env_folder_name(self.dataset[env]) or str(env)
            out += lopsided_warnings(f"env {env} ({name})", self.counts(env), self.rule)
        return out


def env_subsets(dataset, test_envs, scores_file, threshold=None, preset=None,
                data_dir=None, model=None, pretrained=None) -> dict[int, dict[str, list[int]]]:
    """Per test environment, ``{"ip": [...], "oop": [...]}`` item indices; prints the counts."""
    table = read_scores(scores_file)
    provenance.check_model(table, preset, model, pretrained)
    if table.fixed_subsets and (threshold is not None or preset is not None):
        raise ValueError(f"alignment score file {scores_file!r} carries fixed IP/OOP subsets "
                         f"({table.meta.get('source', 'imported')}); --alignment_threshold / "
                         "--alignment_preset do not apply to it: leave them out")
    rule = None if table.fixed_subsets else resolve_rule(threshold, preset)
    split = AlignmentSplit(dataset, table, test_envs, rule, data_dir=data_dir)
    print(split.report())
    for warning in split.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    return split.subsets()


class _PathMapper:
    """Absolute and data_dir-relative forms of many paths under ``env``'s root, fast."""

    def __init__(self, env, data_dir: str | None):
        prefix = str(env.root) if getattr(env, "root", None) else None
        self.prefix = os.path.join(prefix, "") if prefix else None
        self.prefix_abs = os.path.join(os.path.abspath(prefix), "") if prefix else None
        self.data_dir = data_dir
        root = os.path.join(os.path.abspath(data_dir), "") if data_dir else None
        self.rel_prefix = None
        if root and self.prefix_abs and self.prefix_abs.startswith(root):
            self.rel_prefix = self.prefix_abs[len(root):].replace(os.sep, "/")

    def __call__(self, path: str) -> tuple[str, str]:
        tail = path[len(self.prefix):] if self.prefix and path.startswith(self.prefix) else None
        parts = tail.split(os.sep) if tail else ()
        if parts and not {"", ".", ".."} & set(parts):
            absolute = self.prefix_abs + tail
            if self.rel_prefix is not None:
                return absolute, self.rel_prefix + tail.replace(os.sep, "/")
        else:
            absolute = os.path.normpath(os.path.abspath(path))
        return absolute, relative_path(absolute, self.data_dir)


def image_items(dataset, envs, data_dir: str | None):
    """One row per image of ``envs``: ``env, env_name, path, abs_path, label, class``."""
    columns = {k: [] for k in ("env", "env_name", "path", "abs_path", "label", "class")}
    for env_index in envs:
        env = dataset[env_index]
        samples = env_samples(env)
        if samples is None:
            raise no_paths_error(dataset, env_index)
        classes = getattr(env, "classes", None)
        if classes is None:
            raise ValueError(f"environment {env_index} of {type(dataset).__name__} has no class "
                             "names (classes); the prompt needs the class folder name")
        name = env_folder_name(env) or str(env_index)
        mapper = _PathMapper(env, data_dir)
        mapped = [mapper(path) for path, _ in samples]
        labels = [int(label) for _, label in samples]
        columns["env"] += [int(env_index)] * len(samples)
        columns["env_name"] += [name] * len(samples)
        columns["abs_path"] += [a for a, _ in mapped]
        columns["path"] += [r for _, r in mapped]
        columns["label"] += labels
        columns["class"] += [classes[label] for label in labels]
    return pd.DataFrame(columns).astype({"env": "int64", "label": "int64"})


#: The authors' scoring setting, written in the header of what is imported from their release.
AUTHORS_SETTING = {"model": "ViT-B-16", "pretrained": "laion400m_e32",
                   "prompt": "A photo of {}.",
                   "transform": "DomainBed eval (Resize((224, 224)), ToTensor, ImageNet "
                                "Normalize), as the authors' evaluator"}


def _imported(dataset, dataset_name, frames, data_dir, source: str) -> ScoreTable:
    """The table of the imported ``frames`` (image items with ``abs_path``)."""
    meta = {"dataset": dataset_name or type(dataset).__name__, **AUTHORS_SETTING,
            "source": source, "data_dir": os.path.abspath(data_dir) if data_dir else None,
            provenance.FINGERPRINT_KEY: {k: v for f in frames
                                         for k, v in provenance.items_fingerprints(f).items()}}
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
        lacking = [p for p in paths.values() if not os.path.exists(p)]
        if len(lacking) == len(paths):
            if envs is not None:
                raise FileNotFoundError(f"no score arrays for environment {env_index}: expected "
                                        f"{paths['in']} and {paths['out']}")
            continue
        if lacking:
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
        name = env_folder_name(env)  # None for an env without a root folder
        if name is None:
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
        if both := files["ip"] & files["oop"]:
            raise ValueError(f"{len(both)} images of {name} are in both the IP and the OOP "
                             f"folder, e.g. {sorted(both)[:3]}")
        items = image_items(dataset, [env_index], data_dir)
        within = [relative_path(p, env.root) for p in items["abs_path"]]
        if extra := (files["ip"] | files["oop"]) - set(within):
            raise ValueError(f"{len(extra)} images of the split folders for {name} are not in "
                             f"this dataset, e.g. {sorted(extra)[:3]}; the split was made for "
                             "another copy of the data (or the class folders differ)")
        items["score"] = np.nan
        items["subset"] = np.where([w in files["ip"] for w in within], "ip",
                                   np.where([w in files["oop"] for w in within], "oop", "drop"))
        frames.append(items)
    if not frames:
        raise FileNotFoundError(f"no domain folders of this dataset under {ip_dir} or {oop_dir}")
    return _imported(dataset, dataset_name, frames, data_dir,
                     f"imported split folders IP={os.path.abspath(ip_dir)} "
                     f"OOP={os.path.abspath(oop_dir)}")
