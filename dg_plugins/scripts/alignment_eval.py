"""``python -m dg_plugins.scripts.alignment_eval``: IP/OOP accuracy of already trained models,
without retraining.

    python -m dg_plugins.scripts.alignment_eval --alignment_scores scores.csv \
        [--alignment_threshold T | --alignment_preset teterwak2025] JOB_DIR [JOB_DIR ...] \
        [--data_dir DIR] [--device cuda] [--update_records [--overwrite]] \
        [--out keys.jsonl] [--predictions preds.csv] \
        [--alignment_model ViT-B-16] [--alignment_pretrained laion400m_e32]

For each job folder (a train ``--output_dir``) it loads ``model.pkl`` (or ``--model FILE``),
rebuilds the dataset, the in/out(/uda) splits and the IP/OOP subsets exactly as train does
(:func:`dg_plugins.train.job.build_job_data`: the RNGs seeded with the record's ``seed``, the
dataset from its ``args``, the splits and IP/OOP subsets; then
:func:`dg_plugins.train.evaluate.evaluate`), and prints the same keys train writes with
``--alignment_scores``: ``env{i}_{in,out}_{ip,oop}_acc`` and ``_count`` for every test environment,
besides ``env{i}_{in,out}_acc``. ``--data_dir`` replaces the data folder recorded in the job
(data that moved; the score file must still be the one of that copy of the data, see
:mod:`dg_plugins.alignment.provenance`); ``--alignment_model`` / ``--alignment_pretrained``
reject a score file made by another CLIP model; ``--out`` appends one JSON line per model;
``--predictions`` writes each test image's prediction (``env, env_name, path, split, label,
prediction, correct``; paths as in score files) for :mod:`dg_plugins.scripts.plot_alignment`.

``--update_records`` adds those keys to the job's own records (``results.jsonl``), but only to the
records this command can score correctly. A record's accuracies come from the model at its step;
the saved models are ``model.pkl`` (the model of the final step) and, with train's
``--save_model_every_checkpoint``, ``model_step{N}.pkl``. So a record is updated only if

* the job is done (a ``done`` file: nothing is still appending to the file),
* a model of the record's step exists (``model_step{step}.pkl``, or ``model.pkl`` for the final
  step ``steps - 1``),
* the record's ``args`` (dataset, algorithm, test_envs, seeds, holdout fractions, task, steps) and
  ``hparams`` are the model's, and
* re-evaluating that model gives exactly the record's own ``env{i}_{in,out,uda}_acc`` (within
  ``--acc_tolerance``, default 0: e.g. on another device, allow 0.01). Augmented splits (the
  training environments of a default image job) reproduce too: their evaluation batches are
  functions of (split, batch index) (``dg_plugins.train.evaluate.eval_batches``), whatever the
  number of loader workers;

and, if the record already has IP/OOP keys that differ, only with ``--overwrite``. Every other
record is left byte for byte as it was. The updated record gets the subset keys and, as a train-time
record would, ``alignment_scores`` / ``alignment_threshold`` / ``alignment_preset`` (and
``alignment_model`` / ``alignment_pretrained`` when given) in its ``args``. The file is rewritten
atomically, a line saying what was done is appended to the job's ``out.txt``, and the command
prints which steps were updated and which were not, and why. Note that IID (training-domain
validation) selection may pick a checkpoint without a saved model: its IP/OOP cells then stay
empty unless the job saved every checkpoint; oracle selection reads the last checkpoint, which
model.pkl always covers.

Models are rebuilt with ``pretrained`` false (every weight comes from the saved state dict; no
download needed) and loaded with ``torch.load(weights_only=False)``: only run it on your own files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

from dg_plugins.job import flags as job_flags
from dg_plugins.job.folder import (DONE_FILE, MODEL_FILE, OUT_FILE, RESULTS_FILE, STEP_MODEL_FILE,
                                   step_models)

#: Record args that must agree between a record and the model that is to score it.
JOB_ARGS = ("dataset", "algorithm", "test_envs", "hparams_seed", "trial_seed", "seed",
            "holdout_fraction", "uda_holdout_fraction", "task", "steps")
STEP_MODEL = re.compile(r"model_step(\d+)\.pkl$")
SUBSET_KEY = re.compile(r"env\d+_(in|out|uda)_(\w+)_(acc|count)$")
BASE_KEY = re.compile(r"env\d+_(in|out|uda)_acc$")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dg_plugins.scripts.alignment_eval",
                                description="IP/OOP accuracy of trained models (no retraining).")
    p.add_argument("jobs", nargs="+", help="train output folders (holding model.pkl)")
    p.add_argument("--alignment_scores", required=True, help="score file (alignment_scores)")
    job_flags.add_flags(p, "alignment", skip=("alignment_scores",))
    p.add_argument("--model", default=None,
                   help="model file to score instead of <job>/model.pkl (one job only)")
    p.add_argument("--data_dir", default=None, help="data folder (default: the job's)")
    p.add_argument("--device", default=None)
    p.add_argument("--n_workers", type=int, default=None, help="loader workers for evaluation")
    p.add_argument("--update_records", action="store_true",
                   help="add the keys to the job's records that a saved model can score")
    p.add_argument("--overwrite", action="store_true",
                   help="with --update_records: replace differing IP/OOP keys already there")
    p.add_argument("--acc_tolerance", type=float, default=0.0,
                   help="allowed difference between a record's accuracies and the re-evaluated "
                   "ones (default 0)")
    p.add_argument("--out", default=None, help="append one JSON line of keys per model here")
    p.add_argument("--predictions", default=None,
                   help="write per-image predictions of the scored models (CSV)")
    p.add_argument("--import", dest="plugins", nargs="*", default=[],
                   help="plugin modules registering algorithms or datasets")
    return p


class JobContext:
    """One job's dataset, splits and IP/OOP subsets, rebuilt as train builds them."""

    def __init__(self, job_dir: str, saved: dict, options):
        from dg_plugins.runtime import pick_device
        from dg_plugins.train.job import build_job_data

        self.job_dir = job_dir
        args = dict(saved["args"])
        if options.data_dir is not None:
            args["data_dir"] = options.data_dir
        args.setdefault("task", "domain_generalization")
        args.setdefault("uda_holdout_fraction", 0)
        for flag in job_flags.ALIGNMENT_ARGS:  # this command's, not the job's own
            args[flag] = getattr(options, flag)
        self.args = argparse.Namespace(**args)
        self.hparams = dict(saved["model_hparams"])
        self.device = pick_device(options.device)
        data = build_job_data(self.args, self.hparams, options.n_workers)
        self.dataset, self.splits, self.workers = data.dataset, data.splits, data.workers
        steps = self.args.steps or self.dataset.N_STEPS
        self.final_step = steps - 1

    def algorithm(self, saved: dict):
        from dg_plugins.registry import ALGORITHMS

        hparams = dict(saved["model_hparams"])
        if "pretrained" in hparams:  # every weight comes from the state dict: no download
            hparams["pretrained"] = False
            hparams["pretrained_path"] = None
        algorithm = ALGORITHMS.get(saved["args"]["algorithm"])(
            saved["model_input_shape"], saved["model_num_classes"], saved["model_num_domains"],
            hparams)
        try:
            algorithm.load_state_dict(saved["model_dict"])
        except RuntimeError as err:
            raise ValueError(f"the saved model does not fit {saved['args']['algorithm']} as "
                             f"registered here: {err}") from None
        return algorithm.to(self.device)

    def evaluate(self, algorithm) -> dict:
        """The record's accuracy keys, computed as the train job computes them: the same
        evaluation (batches of augmented splits seeded by split and batch index,
        ``splits.eval_seed``) under the same deterministic-algorithms setting and precision
        (the job's compute settings, :mod:`dg_plugins.train.precision`)."""
        from dg_plugins.train.evaluate import evaluate
        from dg_plugins.train.precision import Compute

        compute = Compute.of(self.args)
        with compute.active(self.device):
            return evaluate(algorithm, self.splits, self.device, num_workers=self.workers,
                            compute=compute)

    def predictions(self, algorithm, model_name: str):
        """Per-image predictions on the test environments' splits."""
        import contextlib

        import numpy as np
        import pandas as pd
        import torch

        from dg_plugins.alignment.wrapper import env_folder_name, env_samples, relative_path
        from dg_plugins.train.evaluate import eval_batches, eval_seed
        from dg_plugins.train.splits import env_indices

        rows = []
        algorithm.eval()
        try:
            for name, split, env in self.splits.eval_named():
                if env is None or env not in self.args.test_envs:
                    continue
                preds, labels = [], []
                with torch.no_grad(), contextlib.closing(
                        eval_batches(split, 64, self.workers, eval_seed(name))) as batches:
                    for x, y in batches:  # closing: workers end here, also on an error
                        preds.append(algorithm.predict(x.to(self.device)).argmax(1).cpu())
                        labels.append(torch.as_tensor(y))
                preds = torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)
                labels = torch.cat(labels).numpy() if labels else np.zeros(0, dtype=np.int64)
                positions = env_indices(split)
                samples = env_samples(self.dataset[env])
                env_name = env_folder_name(self.dataset[env])
                for pos, pred, label in zip(positions, preds, labels):
                    rows.append({"job": os.path.basename(os.path.normpath(self.job_dir)),
                                 "model": model_name, "env": int(env), "env_name": env_name,
                                 "path": relative_path(samples[pos][0], self.args.data_dir)
                                 if samples is not None else str(pos),
                                 "split": name.rsplit("_", 1)[1], "label": int(label),
                                 "prediction": int(pred), "correct": int(pred == label)})
        finally:
            algorithm.train()
        return pd.DataFrame(rows)


def load_model_file(path: str) -> dict:
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=False)
    needed = {"args", "model_input_shape", "model_num_classes", "model_num_domains",
              "model_hparams", "model_dict"}
    if not isinstance(saved, dict) or not needed <= set(saved):
        raise ValueError(f"{path} is not a train model file (expected the keys {sorted(needed)})")
    return saved


def model_files(job_dir: str) -> dict[str, str]:
    """``{file name: path}`` of the job's saved models."""
    out = {}
    final = os.path.join(job_dir, MODEL_FILE)
    if os.path.exists(final):
        out[MODEL_FILE] = final
    for path in step_models(job_dir):
        if STEP_MODEL.search(path):
            out[os.path.basename(path)] = path
    return out


def subset_keys(keys: dict) -> dict:
    return {k: v for k, v in keys.items() if SUBSET_KEY.match(k)}


def _same(a, b, tolerance: float) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    return abs(a - b) <= tolerance


def args_mismatch(record: dict, saved: dict) -> str | None:
    args = record.get("args") or {}
    for key in JOB_ARGS:
        if key in saved["args"] and args.get(key) != saved["args"].get(key):
            return f"args.{key} is {args.get(key)!r} in the record, {saved['args'].get(key)!r} " \
                   "in the model"
    if record.get("hparams") != saved["model_hparams"]:
        return "its hparams differ from the model's"
    return None


def update_records(ctx: JobContext, options, load) -> list[str]:
    """Add the subset keys to the records that a saved model can score (see the module
    docstring). ``load(model file name) -> (saved dict, evaluated keys)``, memoised."""
    from dg_plugins.files import atomic_write_bytes

    job = ctx.job_dir
    results = os.path.join(job, RESULTS_FILE)
    messages = []
    if not os.path.exists(os.path.join(job, DONE_FILE)):
        return [f"{job}: not done (no 'done' file; it may still be running): records left "
                "untouched"]
    if not os.path.exists(results):
        return [f"{job}: no results.jsonl"]
    with open(results, "rb") as f:
        lines = f.read().split(b"\n")
    models = model_files(job)
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
        step_model = STEP_MODEL_FILE.format(step=step)
        name = MODEL_FILE if step == ctx.final_step and MODEL_FILE in models else (
            step_model if step_model in models else None)
        if name is None:
            skipped.append(f"step {step}: no saved model of that step")
            continue
        saved, keys = load(name)
        why = args_mismatch(record, saved)
        if why is None:
            base = {k: v for k, v in keys.items() if BASE_KEY.match(k)}
            differ = [k for k, v in base.items()
                      if k not in record or not _same(float(record[k]), float(v),
                                                      options.acc_tolerance)]
            if differ:
                why = (f"re-evaluating {name} gives other accuracies than the record "
                       f"({differ[0]}: {record.get(differ[0])} vs {base[differ[0]]})")
        if why is not None:
            skipped.append(f"step {step}: {why}")
            continue
        new = subset_keys(keys)
        old = subset_keys(record)
        if old and old.keys() == new.keys() and all(_same(old[k], new[k], 0) for k in new):
            skipped.append(f"step {step}: already has these keys")
            continue
        if old and not options.overwrite:
            skipped.append(f"step {step}: has other IP/OOP keys (use --overwrite to replace)")
            continue
        for k in old:
            record.pop(k)
        record.update(new)
        record_args = dict(record.get("args") or {})
        for flag in job_flags.ALIGNMENT_ARGS:
            record_args.pop(flag, None)
            value = getattr(options, flag)
            if value is not None:
                record_args[flag] = value
        record["args"] = record_args
        lines[number] = json.dumps(record, sort_keys=True).encode()
        updated.append((step, name))
    if updated:
        atomic_write_bytes(results, b"\n".join(lines))
        with open(os.path.join(job, OUT_FILE), "a") as f:
            f.write(f"alignment_eval {time.strftime('%Y-%m-%dT%H:%M:%S')}: added IP/OOP keys to "
                    f"the records of steps {[s for s, _ in updated]} (models "
                    f"{sorted({n for _, n in updated})}; scores {options.alignment_scores}, "
                    f"threshold {options.alignment_threshold}, preset "
                    f"{options.alignment_preset})\n")
        messages.append(f"{job}: updated the records of steps {[s for s, _ in updated]} in "
                        f"{results}")
    else:
        messages.append(f"{job}: no record updated")
    for reason in skipped:
        messages.append(f"  left untouched: {reason}")
    return messages


def format_keys(keys: dict) -> str:
    names = sorted(k for k in keys if k.endswith("_acc") or k.endswith("_count"))
    width = max((len(k) for k in names), default=0)
    return "\n".join(f"  {k:<{width}}  {keys[k]:.4f}" if k.endswith("_acc")
                     else f"  {k:<{width}}  {keys[k]}" for k in names)


def main(argv=None) -> int:
    options = build_parser().parse_args(argv)
    from dg_plugins import plugins as plugins_lib
    from dg_plugins.train.run import user_errors

    if options.model and len(options.jobs) != 1:
        print("error: --model names one model file: give one job folder", file=sys.stderr)
        return 2
    if options.model and options.update_records:
        print("error: --update_records uses the job's own model files; leave out --model",
              file=sys.stderr)
        return 2
    try:
        plugins_lib.load(options.plugins)
        if options.alignment_model is not None or options.alignment_pretrained is not None:
            from dg_plugins.alignment import provenance, read_scores

            provenance.check_model(read_scores(options.alignment_scores), None,
                                   options.alignment_model, options.alignment_pretrained)
        prediction_frames = []
        for job in options.jobs:
            models = model_files(job)
            first = options.model or models.get(MODEL_FILE) or next(iter(models.values()), None)
            if first is None:
                raise FileNotFoundError(f"{job}: no model.pkl or model_step*.pkl (was the job "
                                        "run with --skip_model_save, or is it unfinished?)")
            saved_first = load_model_file(first)
            ctx = JobContext(job, saved_first, options)
            cache = {}

            def load(name, _ctx=ctx, _models=models, _cache=cache):
                if name not in _cache:
                    saved = load_model_file(_models[name]) if name in _models else \
                        load_model_file(name)
                    algorithm = _ctx.algorithm(saved)
                    _cache[name] = (saved, _ctx.evaluate(algorithm), algorithm)
                return _cache[name][:2]

            name = options.model or os.path.basename(first)
            saved, keys = load(name)
            print(f"{job} ({name}, {saved['args']['algorithm']} on {saved['args']['dataset']}, "
                  f"test_envs {saved['args']['test_envs']}):")
            print(format_keys(keys))
            if options.out:
                with open(options.out, "a") as f:
                    f.write(json.dumps({"output_dir": job, "model": name, **keys},
                                       sort_keys=True) + "\n")
            if options.predictions:
                prediction_frames.append(ctx.predictions(cache[name][2], name))
            if options.update_records:
                for message in update_records(ctx, options, load):
                    print(message)
        if options.predictions and prediction_frames:
            import pandas as pd

            pd.concat(prediction_frames, ignore_index=True).to_csv(options.predictions,
                                                                   index=False)
            print(f"wrote per-image predictions to {options.predictions}")
    except user_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
