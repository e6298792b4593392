"""One training job, DomainBed-compatible (protocol spec 7), resumable.

``run(args)`` takes the parsed train CLI namespace (see :mod:`dg_plugins.scripts.train`) and
writes DomainBed's output folder: ``out.txt``/``err.txt`` (Tee'd, appended), ``results.jsonl``
(one sorted-key JSON record per checkpoint), ``model.pkl`` and, last, ``done``. Beyond DomainBed:

* ``checkpoint.pt`` (atomic) after every record: model, optimizers, batch streams, RNG states and
  the record count. ``--resume`` continues from it and writes the same records (timing aside) as an
  uninterrupted run with the same seed; records written after the checkpoint are dropped first.
  It is deleted once the job is done.
* A NaN/inf value returned by ``update`` stops the job with an error (no ``done``).
* ``--device`` (default: cuda when available), in-process loading of in-memory data, a progress
  bar on a terminal.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
import traceback

import numpy as np
import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.engine import data
from dg_plugins.engine.outputs import Tee, atomic_torch_save, atomic_write_bytes, format_row
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.runtime import pick_device
from dg_plugins.seeds import seed_hash

#: The keys of ``args`` in records: DomainBed's train CLI, exactly (spec 7.5).
DOMAINBED_ARG_KEYS = (
    "algorithm", "checkpoint_freq", "data_dir", "dataset", "holdout_fraction", "hparams",
    "hparams_seed", "output_dir", "save_model_every_checkpoint", "seed", "skip_model_save",
    "steps", "task", "test_envs", "trial_seed", "uda_holdout_fraction",
)
#: dg_plugins' own train flags that enter the records' ``args`` only when given.
EXTRA_ARG_KEYS = ("alignment_scores", "alignment_threshold", "alignment_preset")
CHECKPOINT_FILE = "checkpoint.pt"
RESULTS_FILE = "results.jsonl"


class NonFiniteLossError(FloatingPointError):
    pass


def user_errors() -> tuple:
    """Exceptions that mean bad input or missing data/weights: reported as one line, no traceback."""
    from dg_plugins.networks import PretrainedWeightsUnavailable
    from dg_plugins.registry import UnknownNameError

    return (UnknownNameError, ValueError, FileNotFoundError, PretrainedWeightsUnavailable)


def load_plugins() -> None:
    """Import the built-in algorithms and datasets, and the plugin modules named in
    ``$DG_PLUGINS_IMPORT`` (they register on import)."""
    from dg_plugins.engine import plugins

    plugins.load()


def validate(args) -> None:
    """Reject bad input before anything is written (names, JSON, environment indices)."""
    load_plugins()
    dataset_cls = DATASETS.get(args.dataset)
    ALGORITHMS.get(args.algorithm)
    hparams_lib.validate(args.algorithm, args.dataset, hparams_lib.parse_overrides(args.hparams))
    if dataset_cls.ENVIRONMENTS:  # datasets that find their environments on disk check later
        check_test_envs(args, dataset_cls.ENVIRONMENTS)
    if not 0 <= args.holdout_fraction < 1:
        raise ValueError(f"--holdout_fraction must be in [0, 1), got {args.holdout_fraction}")
    if not 0 <= args.uda_holdout_fraction < 1:
        raise ValueError(f"--uda_holdout_fraction must be in [0, 1), got "
                         f"{args.uda_holdout_fraction}")


def check_test_envs(args, environments) -> None:
    n_envs = len(environments)
    bad = [t for t in args.test_envs if not 0 <= t < n_envs]
    if bad:
        raise ValueError(f"--test_envs {bad} out of range: {args.dataset} has {n_envs} "
                         f"environments {list(environments)} (valid indices 0..{n_envs - 1})")
    if len(set(args.test_envs)) >= n_envs:
        raise ValueError(f"--test_envs {args.test_envs} leaves no training environment in "
                         f"{args.dataset} ({n_envs} environments)")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def print_environment() -> None:
    import PIL

    try:
        from importlib.metadata import version
        torchvision_version = version("torchvision")
    except Exception:  # pragma: no cover - torchvision absent
        torchvision_version = "n/a"
    print("Environment:")
    print("\tPython: {}".format(sys.version.split(" ")[0]))
    print("\tPyTorch: {}".format(torch.__version__))
    print("\tTorchvision: {}".format(torchvision_version))
    print("\tCUDA: {}".format(torch.version.cuda))
    print("\tCUDNN: {}".format(torch.backends.cudnn.version()))
    print("\tNumPy: {}".format(np.__version__))
    print("\tPIL: {}".format(PIL.__version__))


def args_for_records(args) -> dict:
    """The ``args`` of every record: DomainBed's train flags, plus our extra flags when given."""
    out = {k: getattr(args, k) for k in DOMAINBED_ARG_KEYS}
    out.update({k: getattr(args, k) for k in EXTRA_ARG_KEYS if getattr(args, k, None) is not None})
    return out


def evaluation_subsets(args, dataset) -> dict[int, dict[str, list[int]]]:
    """Named index subsets of test environments to evaluate besides the whole splits:
    ``{env index: {subset name: [item indices of that environment]}}``. Today: the IP/OOP split
    by CLIP alignment score (``--alignment_scores``, see :mod:`dg_plugins.alignment`)."""
    if getattr(args, "alignment_scores", None) is None:
        if getattr(args, "alignment_threshold", None) is not None or getattr(
                args, "alignment_preset", None) is not None:
            raise ValueError("--alignment_threshold / --alignment_preset need --alignment_scores "
                             "FILE (a score file from dg_plugins.scripts.alignment_scores)")
        return {}
    from dg_plugins import alignment

    return alignment.env_subsets(dataset, args.test_envs, args.alignment_scores,
                                 threshold=args.alignment_threshold,
                                 preset=args.alignment_preset, data_dir=args.data_dir)


class Splits:
    """Every environment's in/out(/uda) split, named as DomainBed's train.py names them, and the
    named subsets of test environments to evaluate (``subsets``, see :func:`evaluation_subsets`).
    """

    def __init__(self, dataset, args, hparams, subsets=None):
        self.in_splits, self.out_splits, self.uda_splits = [], [], []
        self.subsets = subsets or {}
        bad = [i for i in self.subsets if i not in args.test_envs]
        if bad:
            raise ValueError(f"evaluation subsets are defined for environments {bad}, which are "
                             f"not test environments ({args.test_envs})")

        def weights(split):
            return data.class_balanced_weights(split) if hparams["class_balanced"] else None

        for env_i, env in enumerate(dataset):
            out, in_ = data.split_dataset(env, int(len(env) * args.holdout_fraction),
                                          seed_hash(args.trial_seed, env_i))
            uda = None
            if env_i in args.test_envs:
                uda, in_ = data.split_dataset(in_, int(len(in_) * args.uda_holdout_fraction),
                                              seed_hash(args.trial_seed, env_i))
            self.in_splits.append((in_, weights(in_)))
            self.out_splits.append((out, weights(out)))
            if uda is not None and len(uda):
                self.uda_splits.append((uda, weights(uda)))
        if args.task == "domain_adaptation" and not self.uda_splits:
            raise ValueError("Not enough unlabeled samples for domain adaptation: set "
                             "--uda_holdout_fraction > 0")

    def eval_named(self):
        """``(name, split, env index)`` in DomainBed's order: all in, all out, then uda by
        position (uda splits have no env index here: None)."""
        named = [(f"env{i}_in", s, i) for i, (s, _) in enumerate(self.in_splits)]
        named += [(f"env{i}_out", s, i) for i, (s, _) in enumerate(self.out_splits)]
        named += [(f"env{i}_uda", s, None) for i, (s, _) in enumerate(self.uda_splits)]
        return named

    def subset_masks(self, split, env: int | None) -> dict[str, np.ndarray]:
        """Boolean masks over ``split``'s items for each named subset of environment ``env``."""
        if env is None or env not in self.subsets:
            return {}
        positions = data.env_indices(split)
        return {name: np.isin(positions, np.asarray(indices, dtype=np.int64))
                for name, indices in self.subsets[env].items()}


def evaluate(algorithm, splits: Splits, device, num_workers: int = 0) -> dict[str, float]:
    """Accuracy keys of one record: ``env{i}_{in,out,uda}_acc`` for every split (DomainBed's), and
    for every named subset of a test environment ``env{i}_{in,out}_{name}_acc`` (NaN when the
    subset is empty) and ``env{i}_{in,out}_{name}_count``."""
    out = {}
    for name, split, env in splits.eval_named():
        masks = splits.subset_masks(split, env)
        accs = data.accuracy(algorithm, split, device, num_workers=num_workers, subsets=masks)
        out[name + "_acc"] = accs[""]
        for subset, mask in masks.items():
            out[f"{name}_{subset}_acc"] = accs[subset]
            out[f"{name}_{subset}_count"] = int(mask.sum())
    return out


def _already_written_records(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def _truncate_records(path: str, keep: int) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    if len(lines) != keep:
        atomic_write_bytes(path, "".join(lines[:keep]).encode())


def run(args, stop_after_step: int | None = None) -> str:
    """Run one job. Returns "done", "already done" or "stopped" (``stop_after_step`` simulates an
    interruption right after that step's checkpoint; tests use it)."""
    validate(args)
    os.makedirs(args.output_dir, exist_ok=True)
    done_path = os.path.join(args.output_dir, "done")
    if args.resume and os.path.exists(done_path):
        print(f"{args.output_dir} is already done; nothing to resume.")
        return "already done"

    real_stdout, real_stderr = sys.stdout, sys.stderr
    sys.stdout = Tee(os.path.join(args.output_dir, "out.txt"), real_stdout)
    sys.stderr = Tee(os.path.join(args.output_dir, "err.txt"), sys.stdout)
    try:
        return _run(args, done_path, stop_after_step, progress_stream=real_stderr)
    except user_errors() as err:
        print(f"error: {err}", file=sys.stderr)  # lands in err.txt and out.txt
        err.reported_in_output_dir = True
        raise
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        tees = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = real_stdout, real_stderr
        for tee in tees:
            tee.close()


def _run(args, done_path, stop_after_step, progress_stream) -> str:
    print_environment()
    record_args = args_for_records(args)
    print("Args:")
    for k, v in sorted(record_args.items()):
        print("\t{}: {}".format(k, v))
    hparams = hparams_lib.job_hparams(args.algorithm, args.dataset, args.hparams_seed,
                                      args.trial_seed, args.hparams)
    print("HParams:")
    for k, v in sorted(hparams.items()):
        print("\t{}: {}".format(k, v))

    seed_everything(args.seed)
    device = pick_device(args.device)
    dataset_cls = DATASETS.get(args.dataset)
    dataset = dataset_cls(args.data_dir, args.test_envs, hparams)
    check_test_envs(args, getattr(dataset, "ENVIRONMENTS", None) or range(len(dataset)))
    splits = Splits(dataset, args, hparams, evaluation_subsets(args, dataset))

    in_memory = getattr(dataset, "IN_MEMORY", False)
    workers = 0 if in_memory or args.n_workers == 0 else data.worker_budget(
        dataset.N_WORKERS if args.n_workers is None else args.n_workers)
    train_envs = [i for i in range(len(dataset)) if i not in args.test_envs]
    per_loader_workers = 0 if workers == 0 else max(1, workers // len(train_envs))
    batch_size = hparams["batch_size"]
    train_streams = [
        data.BatchStream(splits.in_splits[i][0], batch_size, seed_hash(args.seed, "train", i),
                         splits.in_splits[i][1], per_loader_workers)
        for i in train_envs
    ]
    uda_streams = [
        data.BatchStream(split, batch_size, seed_hash(args.seed, "uda", k), weights,
                         per_loader_workers)
        for k, (split, weights) in enumerate(splits.uda_splits)
    ]
    for i, stream in zip(train_envs, train_streams):
        if batch_size > len(stream.dataset):
            print(f"note: batch_size {batch_size} exceeds env{i}'s training split "
                  f"({len(stream.dataset)} samples); batches repeat samples (drawn with "
                  "replacement)", file=sys.stderr)

    algorithm = ALGORITHMS.get(args.algorithm)(dataset.input_shape, dataset.num_classes,
                                               len(train_envs), hparams)
    algorithm.to(device)

    n_steps = args.steps or dataset.N_STEPS
    checkpoint_freq = args.checkpoint_freq or dataset.CHECKPOINT_FREQ
    steps_per_epoch = min(len(split) / batch_size for split, _ in splits.in_splits)
    results_path = os.path.join(args.output_dir, RESULTS_FILE)
    checkpoint_path = os.path.join(args.output_dir, CHECKPOINT_FILE)

    start_step, last_keys = 0, None
    n_records = _already_written_records(results_path)  # the file's line count, kept up to date
    if args.resume and os.path.exists(checkpoint_path):
        # CPU: RNG states must stay CPU ByteTensors; load_state_dict copies onto the model's device
        state = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        algorithm.load_state_dict(state["model"])
        for name, opt in algorithm.optimizers().items():
            opt.load_state_dict(state["optimizers"][name])
        for name, scheduler in algorithm.schedulers().items():
            scheduler.load_state_dict(state["schedulers"][name])
        for stream, s in zip(train_streams + uda_streams, state["streams"]):
            stream.load_state_dict(s)
        set_rng_state(state["rng"])
        start_step, last_keys = state["next_step"], state["last_keys"]
        n_records = state["n_records"]
        _truncate_records(results_path, n_records)
        print(f"Resuming from step {start_step} ({n_records} records kept)")
    elif args.resume:
        n_records = 0
        _truncate_records(results_path, 0)
        print("No checkpoint to resume from; starting from step 0")
    elif n_records:
        print(f"warning: {results_path} already has records; appending (use --resume to continue "
              "an interrupted job, or a fresh --output_dir)", file=sys.stderr)

    accumulated: dict[str, list[float]] = {}
    progress = None
    if progress_stream.isatty():
        from tqdm import tqdm
        progress = tqdm(total=n_steps, initial=start_step, file=progress_stream, leave=False,
                        desc=f"{args.algorithm} on {args.dataset}")

    for step in range(start_step, n_steps):
        step_start = time.time()
        minibatches = [(x.to(device), y.to(device)) for x, y in map(next, train_streams)]
        unlabeled = ([next(s)[0].to(device) for s in uda_streams]
                     if args.task == "domain_adaptation" else None)
        step_vals = algorithm.update(minibatches, unlabeled)
        accumulated.setdefault("step_time", []).append(time.time() - step_start)
        for key, value in step_vals.items():
            value = float(value)
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{args.algorithm}.update returned {key}={value} at step {step}; training "
                    "diverged (try a lower lr). The job stops without 'done'.")
            accumulated.setdefault(key, []).append(value)
        if progress is not None:
            progress.update(1)

        if step % checkpoint_freq == 0 or step == n_steps - 1:
            results = {"step": step, "epoch": step / steps_per_epoch}
            for key, values in accumulated.items():
                results[key] = float(np.mean(values))
            results.update(evaluate(algorithm, splits, device, num_workers=workers))
            results["mem_gb"] = (torch.cuda.max_memory_allocated() / 2**30
                                 if device.type == "cuda" else 0.0)
            keys = sorted(results.keys())
            if keys != last_keys:
                print(format_row(keys, colwidth=12))
                last_keys = keys
            print(format_row([results[k] for k in keys], colwidth=12))
            results["hparams"] = hparams
            results["args"] = record_args
            with open(results_path, "a") as f:
                f.write(json.dumps(results, sort_keys=True) + "\n")
            n_records += 1
            accumulated = {}
            if args.save_model_every_checkpoint:
                save_model(args, algorithm, dataset, hparams, record_args,
                           f"model_step{step}.pkl", len(train_envs))
            atomic_torch_save({
                "next_step": step + 1,
                "model": algorithm.state_dict(),
                "optimizers": {n: o.state_dict() for n, o in algorithm.optimizers().items()},
                "schedulers": {n: s.state_dict() for n, s in algorithm.schedulers().items()},
                "streams": [s.state_dict() for s in train_streams + uda_streams],
                "rng": rng_state(),
                "n_records": n_records,
                "last_keys": last_keys,
            }, checkpoint_path)
            if stop_after_step is not None and step >= stop_after_step:
                if progress is not None:
                    progress.close()
                return "stopped"

    if progress is not None:
        progress.close()
    save_model(args, algorithm, dataset, hparams, record_args, "model.pkl", len(train_envs))
    atomic_write_bytes(done_path, b"done")
    if os.path.exists(checkpoint_path):
        os.unlink(checkpoint_path)
    return "done"


def save_model(args, algorithm, dataset, hparams, record_args, filename, num_domains) -> None:
    """DomainBed's model.pkl (spec 7.4), written atomically; skipped with --skip_model_save."""
    if args.skip_model_save:
        return
    atomic_torch_save({
        "args": record_args,
        "model_input_shape": dataset.input_shape,
        "model_num_classes": dataset.num_classes,
        "model_num_domains": num_domains,
        "model_hparams": hparams,
        "model_dict": algorithm.state_dict(),
    }, os.path.join(args.output_dir, filename))
