"""``alignment_eval``'s logic: a trained job's saved models re-evaluated on the IP/OOP subsets
(Teterwak et al., ICLR 2025; docs/methods/alignment.md), keys printed, records completed where a
saved model reproduces them, per-image predictions; train's rebuild comes in as a RebuiltJob."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import time
from typing import Any, Callable

import numpy as np
import pandas as pd

from dg_plugins.alignment import provenance
from dg_plugins.alignment.scores_file import read_scores
from dg_plugins.alignment.wrapper import env_folder_name, env_samples, relative_path
from dg_plugins.files import atomic_write_bytes
from dg_plugins.job.folder import DONE_FILE, MODEL_FILE, OUT_FILE, RESULTS_FILE, STEP_MODEL_FILE

#: Record args that must agree between a record and the model that is to score it.
JOB_ARGS = ("dataset", "algorithm", "test_envs", "hparams_seed", "trial_seed", "seed",
            "holdout_fraction", "uda_holdout_fraction", "task", "steps")
SUBSET_KEY = re.compile(r"env\d+_(in|out|uda)_(\w+)_(acc|count)$")
BASE_KEY = re.compile(r"env\d+_(in|out|uda)_acc$")
#: The keys of a train model file.
MODEL_KEYS = {"args", "model_input_shape", "model_num_classes", "model_num_domains",
              "model_hparams", "model_dict"}
#: Images per batch of :func:`predictions`.
PREDICTION_BATCH = 64


@dataclasses.dataclass(frozen=True)
class JobFiles:
    """The job-folder file names read and written here (the job contract's)."""

    results: str = RESULTS_FILE
    done: str = DONE_FILE
    out: str = OUT_FILE
    model: str = MODEL_FILE  # the model of the final step
    step_model: str = STEP_MODEL_FILE  # a model saved at a record's step, with ``{step}``


@dataclasses.dataclass
class RebuiltJob:
    """A job's data rebuilt as train builds it, and train's evaluation on it."""

    job_dir: str
    args: Any  # the record's args (a namespace), as :func:`job_args` makes them
    dataset: Any
    splits: Any  # ``eval_named()``: ``(name, split, env index or None)``
    device: Any
    final_step: int
    evaluate: Callable[[Any], dict]  # algorithm -> the record's accuracy keys
    batches: Callable[[str, Any], Any]  # (split name, split) -> a generator of (x, y)
    positions: Callable[[Any], Any]  # split -> its items' positions in their environment


def reevaluate_jobs(jobs: list[str], rebuild, files: JobFiles, rule: dict, *,
                    model: str | None = None, out: str | None = None,
                    predictions_file: str | None = None, update: bool = False,
                    overwrite: bool = False, tolerance: float = 0.0) -> None:
    """Score each job's final model (or ``model``), print its keys, append them to ``out``, write
    predictions, with ``update`` complete the records; ``rule``: the split flags."""
    if rule.get("alignment_model") is not None or rule.get("alignment_pretrained") is not None:
        provenance.check_model(read_scores(rule["alignment_scores"]), None,
                               rule.get("alignment_model"), rule.get("alignment_pretrained"))
    frames = []
    for job in jobs:
        models = model_files(job, files)
        first = first_model(job, models, files, model)
        rebuilt = rebuild(job, load_model_file(first))
        load = SavedModels(rebuilt, models)
        name = model or os.path.basename(first)
        saved, keys = load(name)
        print(f"{job} ({name}, {saved['args']['algorithm']} on {saved['args']['dataset']}, "
              f"test_envs {saved['args']['test_envs']}):")
        names = sorted(k for k in keys if k.endswith(("_acc", "_count")))  # one aligned line each
        width = max((len(k) for k in names), default=0)
        print("\n".join(f"  {k:<{width}}  {keys[k]:.4f}" if k.endswith("_acc")
                        else f"  {k:<{width}}  {keys[k]}" for k in names))
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({"output_dir": job, "model": name, **keys}, sort_keys=True)
                        + "\n")
        if predictions_file:
            frames.append(predictions(rebuilt, load.algorithm(name), name))
        if update:
            for message in update_records(job, rebuilt.final_step, load, files, rule, overwrite,
                                          tolerance):
                print(message)
    if predictions_file and frames:
        pd.concat(frames, ignore_index=True).to_csv(predictions_file, index=False)
        print(f"wrote per-image predictions to {predictions_file}")


def job_args(saved_args: dict, data_dir: str | None, rule: dict) -> dict:
    """The job's args from its model file, ``data_dir`` when given, and this command's ``rule``."""
    args = dict(saved_args)
    if data_dir is not None:
        args["data_dir"] = data_dir
    args.setdefault("task", "domain_generalization")
    args.setdefault("uda_holdout_fraction", 0)
    args.update(rule)
    return args


def load_model_file(path: str) -> dict:
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(saved, dict) or not MODEL_KEYS <= set(saved):
        raise ValueError(f"{path} is not a train model file (expected the keys "
                         f"{sorted(MODEL_KEYS)})")
    return saved


def model_files(job_dir: str, files: JobFiles) -> dict[str, str]:
    """``{file name: path}`` of the job's saved models: the final one, then those of each step."""
    final = os.path.join(job_dir, files.model)
    out = {files.model: final} if os.path.exists(final) else {}
    step_model = re.compile(r"(\d+)".join(map(re.escape, files.step_model.split("{step}"))))
    names = sorted(os.listdir(job_dir)) if os.path.isdir(job_dir) else []
    return {**out, **{name: os.path.join(job_dir, name) for name in names
                      if step_model.fullmatch(name)}}


def first_model(job_dir: str, models: dict[str, str], files: JobFiles,
                model: str | None = None) -> str:
    """The model file scored first (and rebuilt from): ``model`` if given, else the final one."""
    first = model or models.get(files.model) or next(iter(models.values()), None)
    if first is None:
        raise FileNotFoundError(f"{job_dir}: no {files.model} or "
                                f"{files.step_model.format(step='*')} (was the job run with "
                                "--skip_model_save, or is it unfinished?)")
    return first


class SavedModels:
    """``(name) -> (saved dict, evaluated keys)`` for the job's models (``models``: from
    :func:`model_files`; a name outside it is a path), each read and evaluated once."""

    def __init__(self, job: RebuiltJob, models: dict[str, str]):
        self.job, self.models, self.cache = job, models, {}

    def __call__(self, name: str) -> tuple[dict, dict]:
        if name not in self.cache:
            from dg_plugins.registry import ALGORITHMS

            saved = load_model_file(self.models.get(name, name))
            hparams = dict(saved["model_hparams"])
            if "pretrained" in hparams:  # every weight comes from the saved state: no download
                hparams.update(pretrained=False, pretrained_path=None)
            algorithm = ALGORITHMS.get(saved["args"]["algorithm"])(
                saved["model_input_shape"], saved["model_num_classes"],
                saved["model_num_domains"], hparams)
            try:
                algorithm.load_state_dict(saved["model_dict"])
            except RuntimeError as err:
                raise ValueError(f"the saved model does not fit {saved['args']['algorithm']} as "
                                 f"registered here: {err}") from None
            algorithm = algorithm.to(self.job.device)
            self.cache[name] = (saved, self.job.evaluate(algorithm), algorithm)
        return self.cache[name][:2]

    def algorithm(self, name: str):
        self(name)
        return self.cache[name][2]


def subset_keys(keys: dict) -> dict:
    return {k: v for k, v in keys.items() if SUBSET_KEY.match(k)}


def same(a, b, tolerance: float) -> bool:
    """Numbers within ``tolerance`` (NaN equals NaN), anything else equal."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    return abs(a - b) <= tolerance


def update_records(job_dir: str, final_step: int, load, files: JobFiles, rule: dict,
                   overwrite: bool = False, tolerance: float = 0.0) -> list[str]:
    """Add the subset keys to the records a saved model can score (``load``: :class:`SavedModels`):
    job done, a model of the record's step, same args and hparams, its own base accuracies within
    ``tolerance``, no differing IP/OOP keys unless ``overwrite``; other lines stay byte for byte."""
    job, results = job_dir, os.path.join(job_dir, files.results)
    if not os.path.exists(os.path.join(job, files.done)):
        return [f"{job}: not done (no '{files.done}' file; it may still be running): records "
                "left untouched"]
    if not os.path.exists(results):
        return [f"{job}: no {files.results}"]
    with open(results, "rb") as f:
        lines = f.read().split(b"\n")
    models = model_files(job, files)
    updated, skipped = [], []
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            skipped.append(f"line {number + 1}: not valid JSON")
            continue
        step = record.get("step")
        step_model = files.step_model.format(step=step)
        name = files.model if step == final_step and files.model in models else (
            step_model if step_model in models else None)
        if name is None:
            skipped.append(f"step {step}: no saved model of that step")
            continue
        saved, keys = load(name)
        args = record.get("args") or {}  # is the saved model the one of the record?
        why = next((f"args.{key} is {args.get(key)!r} in the record, "
                    f"{saved['args'].get(key)!r} in the model" for key in JOB_ARGS
                    if key in saved["args"] and args.get(key) != saved["args"].get(key)),
                   None if record.get("hparams") == saved["model_hparams"]
                   else "its hparams differ from the model's")
        new, old = subset_keys(keys), subset_keys(record)
        if why is None:
            base = {k: v for k, v in keys.items() if BASE_KEY.match(k)}
            if differ := [k for k, v in base.items()
                          if k not in record or not same(float(record[k]), float(v), tolerance)]:
                why = (f"re-evaluating {name} gives other accuracies than the record "
                       f"({differ[0]}: {record.get(differ[0])} vs {base[differ[0]]})")
            elif old and old.keys() == new.keys() and all(same(old[k], new[k], 0) for k in new):
                why = "already has these keys"
            elif old and not overwrite:
                why = "has other IP/OOP keys (use --overwrite to replace)"
        if why is not None:
            skipped.append(f"step {step}: {why}")
            continue
        for k in old:
            record.pop(k)
        record.update(new)
        record["args"] = {**{k: v for k, v in (record.get("args") or {}).items() if k not in rule},
                          **{flag: value for flag, value in rule.items() if value is not None}}
        lines[number] = json.dumps(record, sort_keys=True).encode()
        updated.append((step, name))
    if updated:
        atomic_write_bytes(results, b"\n".join(lines))
        with open(os.path.join(job, files.out), "a") as f:
            f.write(f"alignment_eval {time.strftime('%Y-%m-%dT%H:%M:%S')}: added IP/OOP keys to "
                    f"the records of steps {[s for s, _ in updated]} (models "
                    f"{sorted({n for _, n in updated})}; scores {rule.get('alignment_scores')}, "
                    f"threshold {rule.get('alignment_threshold')}, preset "
                    f"{rule.get('alignment_preset')})\n")
    done = (f"{job}: updated the records of steps {[s for s, _ in updated]} in {results}"
            if updated else f"{job}: no record updated")
    return [done, *(f"  left untouched: {reason}" for reason in skipped)]


def predictions(job: RebuiltJob, algorithm, model_name: str):
    """Per-image predictions on the test environments' splits: ``job, model, env, env_name, path``
    (as in score files, else the position), ``split, label, prediction, correct``."""
    import torch

    rows = []
    algorithm.eval()
    try:
        for name, split, env in job.splits.eval_named():
            if env is None or env not in job.args.test_envs:
                continue
            preds, labels = [], []
            with torch.no_grad(), contextlib.closing(job.batches(name, split)) as batches:
                for x, y in batches:  # closing: workers end here, also on an error
                    preds.append(algorithm.predict(x.to(job.device)).argmax(1).cpu())
                    labels.append(torch.as_tensor(y))
            preds = torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)
            labels = torch.cat(labels).numpy() if labels else np.zeros(0, dtype=np.int64)
            samples = env_samples(job.dataset[env])
            env_name = env_folder_name(job.dataset[env])
            for pos, pred, label in zip(job.positions(split), preds, labels):
                rows.append({"job": os.path.basename(os.path.normpath(job.job_dir)),
                             "model": model_name, "env": int(env), "env_name": env_name,
                             "path": relative_path(samples[pos][0], job.args.data_dir)
                             if samples is not None else str(pos),
                             "split": name.rsplit("_", 1)[1], "label": int(label),
                             "prediction": int(pred), "correct": int(pred == label)})
    finally:
        algorithm.train()
    return pd.DataFrame(rows)
