"""One training job, DomainBed-compatible (``domainbed/scripts/train.py``), resumable.

``run(args)`` takes the parsed train CLI namespace (see :mod:`dg_plugins.scripts.train`) and
writes DomainBed's output folder: ``out.txt``/``err.txt`` (Tee'd, appended), ``results.jsonl``
(one sorted-key JSON record per checkpoint), ``model.pkl`` and, last, ``done``. Beyond DomainBed:

* ``checkpoint.pt`` (atomic) after every record: model, optimizers, LR schedulers, batch streams,
  RNG states, the record count, the job's args and hparams. ``--resume`` continues from it and
  writes the same records (timing aside) as an uninterrupted run with the same seed; records
  written after the checkpoint are dropped first. It is deleted once the job is done.
* Guarantees (each tested): bad input (unknown names, mistyped or out-of-range hparams,
  non-positive ``--steps``/``--checkpoint_freq``) is rejected before anything is written; a
  finished job is never rerun over (``--force`` starts it over); a folder holding records of an
  interrupted run is continued only with ``--resume`` and only with the same arguments and hparams
  (the differences are listed otherwise; ``output_dir`` and ``data_dir`` may change); every record
  is fsynced before the checkpoint that counts it, and resume checks that the kept records are
  complete and as many as counted; one process at a time holds a job folder (an exclusive lock,
  released when the process dies); leftover temporary files of an interrupted atomic write are
  removed; SIGTERM/SIGINT stop the job at the next step boundary with a checkpoint and exit status
  143/130, so ``--resume`` continues exactly there.
* A NaN/inf value returned by ``update`` stops the job with an error (no ``done``).
* ``--device`` (default: cuda when available), in-process loading of in-memory data, a progress
  bar on a terminal.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import signal
import sys
import time
import traceback

import numpy as np
import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.engine import data
from dg_plugins.engine.checkpoint import (checkpoint_differences, load_checkpoint,
                                          save_checkpoint, seed_everything)
from dg_plugins.engine.job_folder import (CHECKPOINT_FILE, DONE_FILE, RESULTS_FILE, FolderLock,
                                          JobStateError, append_record, keep_counted_records,
                                          read_record_lines, remove_temporary_files)
from dg_plugins.engine.outputs import Tee, format_row
from dg_plugins.engine.splits import Splits, evaluate, evaluation_subsets
from dg_plugins.files import atomic_torch_save, atomic_write_bytes
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.runtime import pick_device
from dg_plugins.seeds import seed_hash

#: The keys of ``args`` in records: DomainBed's train CLI, exactly.
DOMAINBED_ARG_KEYS = (
    "algorithm", "checkpoint_freq", "data_dir", "dataset", "holdout_fraction", "hparams",
    "hparams_seed", "output_dir", "save_model_every_checkpoint", "seed", "skip_model_save",
    "steps", "task", "test_envs", "trial_seed", "uda_holdout_fraction",
)
#: dg_plugins' own train flags that enter the records' ``args`` only when given (the UDG
#: protocol's ``label_fraction``/``pretrain_steps``: see :mod:`dg_plugins.engine.udg`).
EXTRA_ARG_KEYS = ("alignment_scores", "alignment_threshold", "alignment_preset",
                  "label_fraction", "pretrain_steps", "udg_pretrain_epochs", "udg_ft_epochs",
                  "udg_split")


class NonFiniteLossError(FloatingPointError):
    pass


class Interrupted(Exception):
    """SIGTERM/SIGINT stopped the job at a step boundary after a checkpoint; exit with
    ``128 + signum``."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; a "
                         "checkpoint was written: rerun the same command with --resume to continue")
        self.signum = signum
        self.exit_code = 128 + signum


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
    for flag in ("steps", "checkpoint_freq"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {value} (leave it out for "
                             "the dataset's default)")
    if dataset_cls.ENVIRONMENTS:  # datasets that find their environments on disk check later
        check_test_envs(args, dataset_cls.ENVIRONMENTS)
    if not 0 <= args.holdout_fraction < 1:
        raise ValueError(f"--holdout_fraction must be in [0, 1), got {args.holdout_fraction}")
    if not 0 <= args.uda_holdout_fraction < 1:
        raise ValueError(f"--uda_holdout_fraction must be in [0, 1), got "
                         f"{args.uda_holdout_fraction}")
    if any(getattr(args, name, None) is not None for name in
           ("label_fraction", "pretrain_steps", "udg_pretrain_epochs", "udg_ft_epochs",
                  "udg_split")):
        from dg_plugins.engine import udg

        udg.validate(args)


def check_test_envs(args, environments) -> None:
    n_envs = len(environments)
    bad = [t for t in args.test_envs if not 0 <= t < n_envs]
    if bad:
        raise ValueError(f"--test_envs {bad} out of range: {args.dataset} has {n_envs} "
                         f"environments {list(environments)} (valid indices 0..{n_envs - 1})")
    if len(set(args.test_envs)) >= n_envs:
        raise ValueError(f"--test_envs {args.test_envs} leaves no training environment in "
                         f"{args.dataset} ({n_envs} environments)")


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


# --------------------------------------------------------------------------------------------------
# Signals


class StopRequest:
    """Turns SIGTERM/SIGINT into a request to stop at the next step boundary (after a checkpoint);
    a second signal of the same kind while stopping raises at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received twice")
        self.signum = signum
        print(f"received {signal.Signals(signum).name}: stopping after this step with a "
              "checkpoint", file=sys.stderr)

    def __enter__(self) -> "StopRequest":
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# --------------------------------------------------------------------------------------------------
# The job


class Job:
    """One training run, in steps: :meth:`build` (hparams, data, splits, streams, algorithm),
    :meth:`restore` (resume), :meth:`train_step`, :meth:`write_record` (evaluate + append),
    :meth:`checkpoint`, :meth:`finish`."""

    def __init__(self, args, stop: StopRequest, progress_stream=None):
        self.args = args
        self.stop = stop
        self.progress_stream = progress_stream
        self.record_args = args_for_records(args)
        self.results_path = os.path.join(args.output_dir, RESULTS_FILE)
        self.checkpoint_path = os.path.join(args.output_dir, CHECKPOINT_FILE)
        self.start_step = 0
        self.n_records = 0
        self.last_keys = None
        self.accumulated: dict[str, list[float]] = {}

    # build ----------------------------------------------------------------------------------------

    def build(self) -> None:
        args = self.args
        print_environment()
        print("Args:")
        for k, v in sorted(self.record_args.items()):
            print("\t{}: {}".format(k, v))
        self.hparams = hparams_lib.job_hparams(args.algorithm, args.dataset, args.hparams_seed,
                                               args.trial_seed, args.hparams)
        print("HParams:")
        for k, v in sorted(self.hparams.items()):
            print("\t{}: {}".format(k, v))

        seed_everything(args.seed)
        self.device = pick_device(args.device)
        dataset = DATASETS.get(args.dataset)(args.data_dir, args.test_envs, self.hparams)
        check_test_envs(args, getattr(dataset, "ENVIRONMENTS", None) or range(len(dataset)))
        self.dataset = dataset
        self.splits = Splits(dataset, args, self.hparams, evaluation_subsets(args, dataset))
        in_memory = getattr(dataset, "IN_MEMORY", False)
        self.workers = 0 if in_memory or args.n_workers == 0 else data.worker_budget(
            dataset.N_WORKERS if args.n_workers is None else args.n_workers)
        print(f"Data: loader workers: {self.workers} (" + (
            "in-memory dataset, loaded in-process" if in_memory else
            f"min(--n_workers or the dataset's N_WORKERS {dataset.N_WORKERS}, "
            f"{os.cpu_count() or 1} CPUs)") + ")")
        self.train_envs = [i for i in range(len(dataset)) if i not in args.test_envs]
        self.algorithm = self.make_algorithm()
        self.algorithm.to(self.device)
        self.streams = self.make_streams(self.batch_size())
        self.n_steps = args.steps or dataset.N_STEPS
        self.checkpoint_freq = args.checkpoint_freq or dataset.CHECKPOINT_FREQ
        self.steps_per_epoch = min(len(split) / self.hparams["batch_size"]
                                   for split, _ in self.splits.in_splits)
        self.algorithm.epoch_steps = self.steps_per_epoch

    # Hooks a job kind may override (the UDG fine-tuning job, dg_plugins.engine.udg, does).

    def make_algorithm(self):
        """The model this job trains (``--algorithm``, built for the source environments)."""
        return ALGORITHMS.get(self.args.algorithm)(
            self.dataset.input_shape, self.dataset.num_classes, len(self.train_envs),
            self.hparams)

    def batch_size(self) -> int:
        """Samples per source environment per step."""
        return self.hparams["batch_size"]

    def train_split(self, env: int):
        """``(split, sampling weights)`` that environment ``env``'s training stream draws from."""
        return self.splits.in_splits[env]

    def make_streams(self, batch_size: int) -> list:
        """Training streams of the source environments' in-splits, then uda streams."""
        per_loader = 0 if self.workers == 0 else max(1, self.workers // len(self.train_envs))
        streams = []
        for i in self.train_envs:
            split, weights = self.train_split(i)
            if batch_size > len(split):
                print(f"note: batch_size {batch_size} exceeds env{i}'s training split "
                      f"({len(split)} samples); batches repeat samples (drawn with replacement)",
                      file=sys.stderr)
            streams.append(data.BatchStream(split, batch_size, seed_hash(self.args.seed, "train", i),
                                            weights, per_loader))
        self.n_train_streams = len(streams)
        for k, (split, weights) in enumerate(self.splits.uda_splits):
            streams.append(data.BatchStream(split, batch_size, seed_hash(self.args.seed, "uda", k),
                                            weights, per_loader))
        return streams

    # resume -----------------------------------------------------------------------------------------

    def restore(self) -> None:
        """Continue from ``checkpoint.pt`` with ``--resume`` (after checking that it was written
        by the same configuration), or start from step 0."""
        if not self.args.resume:
            return
        if not os.path.exists(self.checkpoint_path):
            keep_counted_records(self.results_path, 0)
            print("No checkpoint to resume from; starting from step 0")
            return
        state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
        diffs = checkpoint_differences(state, self.record_args, self.hparams)
        if diffs:
            raise JobStateError(
                "--resume with other arguments than the interrupted run would mix two "
                "configurations in one results file:\n  " + "\n  ".join(diffs)
                + "\nRerun with the original arguments, or start over with --force.")
        keep_counted_records(self.results_path, state["n_records"])
        state = load_checkpoint(self.checkpoint_path, self.algorithm, self.streams)
        self.start_step, self.n_records = state["next_step"], state["n_records"]
        self.last_keys = state["last_keys"]
        self.accumulated = state.get("accumulated", {})
        print(f"Resuming from step {self.start_step} ({self.n_records} records kept)")

    # train ------------------------------------------------------------------------------------------

    def train_step(self, step: int) -> None:
        start = time.time()
        device = self.device
        train_streams = self.streams[:self.n_train_streams]
        minibatches = [(x.to(device), y.to(device)) for x, y in map(next, train_streams)]
        unlabeled = ([next(s)[0].to(device) for s in self.streams[self.n_train_streams:]]
                     if self.args.task == "domain_adaptation" else None)
        values = self.algorithm.update(minibatches, unlabeled)
        self.accumulated.setdefault("step_time", []).append(time.time() - start)
        for key, value in values.items():
            value = float(value)
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{self.args.algorithm}.update returned {key}={value} at step {step}; "
                    "training diverged (try a lower lr). The job stops without 'done'.")
            self.accumulated.setdefault(key, []).append(value)

    def write_record(self, step: int) -> None:
        results = {"step": step, "epoch": step / self.steps_per_epoch}
        for key, values in self.accumulated.items():
            results[key] = float(np.mean(values))
        results.update(evaluate(self.algorithm, self.splits, self.device,
                                num_workers=self.workers))
        results["mem_gb"] = (torch.cuda.max_memory_allocated() / 2**30
                             if self.device.type == "cuda" else 0.0)
        keys = sorted(results.keys())
        if keys != self.last_keys:
            print(format_row(keys, colwidth=12))
            self.last_keys = keys
        print(format_row([results[k] for k in keys], colwidth=12))
        results["hparams"] = self.hparams
        results["args"] = self.record_args
        append_record(self.results_path, results)
        self.n_records += 1
        self.accumulated = {}
        if self.args.save_model_every_checkpoint:
            self.save_model(f"model_step{step}.pkl")

    def checkpoint(self, next_step: int) -> None:
        save_checkpoint(self.checkpoint_path, next_step=next_step, algorithm=self.algorithm,
                        streams=self.streams, n_records=self.n_records, last_keys=self.last_keys,
                        accumulated=self.accumulated, record_args=self.record_args,
                        hparams=self.hparams)

    def model_extras(self) -> dict:
        """Keys a job kind adds to model.pkl beside DomainBed's (none here)."""
        return {}

    def save_model(self, filename: str) -> None:
        save_model(self.args, self.algorithm, self.dataset, self.hparams, self.record_args,
                   filename, len(self.train_envs), self.model_extras())

    def finish(self) -> None:
        self.save_model("model.pkl")
        atomic_write_bytes(os.path.join(self.args.output_dir, DONE_FILE), b"done")
        if os.path.exists(self.checkpoint_path):
            os.unlink(self.checkpoint_path)

    def close(self) -> None:
        """Shut down the training streams' loader workers (see :mod:`dg_plugins.engine.data`)."""
        for stream in getattr(self, "streams", ()):
            stream.close()

    def run(self, stop_after_step: int | None = None) -> str:
        """Build, restore and train; the loader workers are shut down on every way out (done,
        error, NaN stop, a signal, a refused resume)."""
        try:
            return self._run(stop_after_step)
        finally:
            self.close()

    def _run(self, stop_after_step: int | None) -> str:
        self.build()
        self.restore()
        progress = None
        if self.progress_stream is not None and self.progress_stream.isatty():
            from tqdm import tqdm
            progress = tqdm(total=self.n_steps, initial=self.start_step, leave=False,
                            file=self.progress_stream,
                            desc=f"{self.args.algorithm} on {self.args.dataset}")
        try:
            for step in range(self.start_step, self.n_steps):
                self.train_step(step)
                if progress is not None:
                    progress.update(1)
                recorded = step % self.checkpoint_freq == 0 or step == self.n_steps - 1
                if recorded:
                    self.write_record(step)
                if recorded or self.stop.signum is not None:
                    self.checkpoint(step + 1)
                if self.stop.signum is not None:
                    raise Interrupted(self.stop.signum, step)
                if recorded and stop_after_step is not None and step >= stop_after_step:
                    return "stopped"
        finally:
            if progress is not None:
                progress.close()
        self.finish()
        return "done"


# --------------------------------------------------------------------------------------------------
# Entry point


def prepare_output_dir(args) -> None:
    """Decide, under the folder lock, whether this run may proceed: a finished job is rerun only
    with ``--force`` (which first removes ``done``, the records, models and checkpoint); a folder
    with records of an interrupted run needs ``--resume`` (or ``--force``)."""
    folder = args.output_dir
    done = os.path.exists(os.path.join(folder, DONE_FILE))
    records = read_record_lines(os.path.join(folder, RESULTS_FILE))
    if getattr(args, "force", False):
        if done or records or os.path.exists(os.path.join(folder, CHECKPOINT_FILE)):
            print(f"--force: starting {folder} over (removing done, records, models and the "
                  "checkpoint)", file=sys.stderr)
        for name in [DONE_FILE, RESULTS_FILE, CHECKPOINT_FILE, "model.pkl"] + [
                os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(folder),
                                                                    "model_step*.pkl"))]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
        return
    if done:
        raise JobStateError(
            f"{folder} holds a finished job ('done' exists); nothing was changed. To run it "
            "again from scratch pass --force (its records and model are replaced), or choose "
            "another --output_dir.")
    if records and not args.resume:
        raise JobStateError(
            f"{folder} holds {len(records)} records of an interrupted run; continue it with "
            "--resume (same arguments), or start over with --force.")


def run(args, stop_after_step: int | None = None) -> str:
    """Run one job. Returns "done", "already done" (``--resume`` of a finished job) or "stopped"
    (``stop_after_step`` simulates an interruption right after that step's checkpoint; tests use
    it). Raises :class:`Interrupted` on SIGTERM/SIGINT (after a checkpoint)."""
    validate(args)
    os.makedirs(args.output_dir, exist_ok=True)
    with FolderLock(args.output_dir):
        if args.resume and not getattr(args, "force", False) and os.path.exists(
                os.path.join(args.output_dir, DONE_FILE)):
            print(f"{args.output_dir} is already done; nothing to resume.")
            return "already done"
        prepare_output_dir(args)
        removed = remove_temporary_files(args.output_dir)
        real_stdout, real_stderr = sys.stdout, sys.stderr
        sys.stdout = Tee(os.path.join(args.output_dir, "out.txt"), real_stdout)
        sys.stderr = Tee(os.path.join(args.output_dir, "err.txt"), sys.stdout)
        try:
            for path in removed:
                print(f"removed a leftover temporary file of an interrupted write: {path}",
                      file=sys.stderr)
            with StopRequest() as stop:
                job_kind = Job
                if getattr(args, "label_fraction", None) is not None:
                    from dg_plugins.engine.udg import UDGJob as job_kind
                return job_kind(args, stop, progress_stream=real_stderr).run(stop_after_step)
        except user_errors() as err:
            print(f"error: {err}", file=sys.stderr)  # lands in err.txt and out.txt
            err.reported_in_output_dir = True
            raise
        except Interrupted as err:
            print(f"stopped: {err}", file=sys.stderr)
            err.reported_in_output_dir = True
            raise
        except BaseException as err:
            traceback.print_exc()
            with contextlib.suppress(AttributeError):
                err.reported_in_output_dir = True
            raise
        finally:
            tees = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = real_stdout, real_stderr
            for tee in tees:
                tee.close()


def save_model(args, algorithm, dataset, hparams, record_args, filename, num_domains,
               extras: dict | None = None) -> None:
    """DomainBed's model.pkl (as ``domainbed/scripts/train.py`` writes it) plus ``extras``,
    written atomically; skipped with --skip_model_save."""
    if args.skip_model_save:
        return
    atomic_torch_save({
        "args": record_args,
        "model_input_shape": dataset.input_shape,
        "model_num_classes": dataset.num_classes,
        "model_num_domains": num_domains,
        "model_hparams": hparams,
        "model_dict": algorithm.state_dict(),
        **(extras or {}),
    }, os.path.join(args.output_dir, filename))
