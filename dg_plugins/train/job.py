"""The one step loop of every kind of job (``domainbed/scripts/train.py``'s loop): :meth:`Job.build`
decides every setting once (hparams, data, splits, algorithm, batch streams, length, epoch, the
compute settings of :mod:`.precision`), :meth:`Job.restore` continues from the resume file, then
each step trains, and every ``checkpoint_freq`` steps the job evaluates, appends a record and
writes the resume file; at the end it saves the model and marks the folder done.
:func:`build_job_data` is the part of the build that a re-evaluation of a saved model
(alignment_eval) shares."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.algorithms.base import gradient_scaling, guard_scaled_steps, lr_factor
from dg_plugins.datasets import decoded
from dg_plugins.datasets.device_augment import use_device_augmentation
from dg_plugins.files import atomic_torch_save, atomic_write_bytes
from dg_plugins.networks.pretrained import recording_weights
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.runtime import pick_device
from dg_plugins.seeds import seed_everything, seed_hash
from dg_plugins.train import batches
from dg_plugins.train.checkpoint import (RESTART_FIX, apply_checkpoint, checkpoint_differences,
                                         read_checkpoint, save_checkpoint)
from dg_plugins.job.flags import flag, record_args
from dg_plugins.train.evaluate import evaluate
from dg_plugins.job.folder import (CHECKPOINT_FILE, DONE_FILE, MODEL_FILE, RESULTS_FILE,
                                   STEP_MODEL_FILE, JobStateError)
from dg_plugins.job.records import append_record, format_row, keep_counted_records
from dg_plugins.job import sizes
from dg_plugins.job.selection import DEFAULT_EVAL_SPLITS, EVALUATED_KEY, evaluated_splits
from dg_plugins.train.precision import FP16_FIX, Compute
from dg_plugins.train.progress import DEFAULT_INTERVAL_S, Progress
from dg_plugins.train.shown_hparams import print_hparams
from dg_plugins.train.splits import Splits, evaluation_subsets

#: Functions called after every training step as ``hook(job, step)``, before the step's record,
#: checkpoint and stop check (:func:`add_step_hook`). A plugin module (``$DG_PLUGINS_IMPORT``) may
#: add one, e.g. to log; the test suite holds a running job at a step with one
#: (``tests/job_gate.py``), so that its tests never race a job's speed.
STEP_HOOKS: list = []


def add_step_hook(hook) -> None:
    """Call ``hook(job, step)`` after every training step of every job of this process (a hook
    added twice is called once)."""
    if hook not in STEP_HOOKS:
        STEP_HOOKS.append(hook)


class NonFiniteLossError(FloatingPointError):
    pass


class Interrupted(Exception):
    """SIGTERM/SIGINT stopped the job at a safe point (:meth:`after_step`: a step boundary, after
    a checkpoint); train exits with ``128 + signum``."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @classmethod
    def after_step(cls, signum: int, step: int) -> "Interrupted":
        return cls(signum, f"stopped by {signal.Signals(signum).name} after step {step}; a "
                   "checkpoint was written: rerun the same command with --resume to continue")


def check_test_envs(args, environments) -> None:
    n_envs = len(environments)
    bad = [t for t in args.test_envs if not 0 <= t < n_envs]
    if bad:
        raise ValueError(f"--test_envs {bad} out of range: {args.dataset} has {n_envs} "
                         f"environments {list(environments)} (valid indices 0..{n_envs - 1})")
    if len(set(args.test_envs)) >= n_envs:
        raise ValueError(f"--test_envs {args.test_envs} leaves no training environment in "
                         f"{args.dataset} ({n_envs} environments)")


def print_environment(device: torch.device) -> None:
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
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"\tDevice: {device}{name}")


def print_weights(loaded: list[str]) -> None:
    """Say which pretrained weights the model took, and from where (a cache file, a download,
    a local file: :func:`dg_plugins.networks.pretrained.recording_weights`), or that it starts
    from random initialisation."""
    if not loaded:
        print("Weights: random initialisation (no pretrained weights loaded)")
    for line in loaded:
        print(f"Weights: {line}")


@dataclass
class JobData:
    """A job's dataset, its splits (with the IP/OOP subsets to evaluate) and its loader workers
    (``in_memory``: the dataset's tensors are gathered in-process, without workers; ``source``:
    where the number of workers came from)."""

    dataset: object
    splits: Splits
    workers: int
    in_memory: bool
    source: str


def build_job_data(args, hparams: dict, n_workers: int | None = None,
                   compute: "Compute | None" = None) -> JobData:
    """The data of the job of ``args`` (train's namespace, or a record's ``args``), built as the
    job builds it: every RNG seeded with ``args.seed`` first (a dataset that draws its data, such
    as Debug28, draws it then), the dataset (its augmentation on the device with
    ``--augment_on device``), its test environments checked, the splits, and its loader workers
    (:func:`dg_plugins.train.batches.worker_budget` of ``n_workers``; none for a dataset held in
    memory)."""
    seed_everything(args.seed)
    dataset = DATASETS.get(args.dataset)(args.data_dir, args.test_envs, hparams)
    if (compute or Compute.of(args)).augment_on == "device":
        use_device_augmentation(dataset, args.dataset)
    check_test_envs(args, getattr(dataset, "ENVIRONMENTS", None) or range(len(dataset)))
    splits = Splits(dataset, args, hparams, evaluation_subsets(args, dataset))
    in_memory = getattr(dataset, "IN_MEMORY", False)
    if in_memory:
        workers, source = 0, "in-memory dataset, loaded in-process"
    elif n_workers is None and dataset.N_WORKERS == 0:
        workers, source = 0, f"{args.dataset}'s N_WORKERS is 0"
    else:
        workers, source = batches.worker_budget(n_workers)
    return JobData(dataset, splits, workers, in_memory, source)


# --------------------------------------------------------------------------------------------------
# The job


class Job:
    """One training run, in steps: :meth:`build` (hparams, data, splits, streams, algorithm),
    :meth:`restore` (resume), :meth:`train_step`, :meth:`write_record` (evaluate + append),
    :meth:`checkpoint`, :meth:`finish`; :meth:`run` is the one step loop of every kind of job
    (the UDG protocol's pretraining and fine-tuning jobs are kinds of Job,
    :mod:`dg_plugins.train.udg`).
    ``stop``: the entry point's :class:`dg_plugins.signals.StopRequest` (its ``signum`` is
    set when a stop signal came)."""

    #: The algorithm's method a step calls and the phase it trains (named when a loss diverges).
    UPDATE = "update"
    PHASE = "training"
    #: Whether one stream draws pooled batches (``batch_sampling`` "pooled"; set by :meth:`build`).
    pooled = False

    def __init__(self, args, stop, progress_stream=None, compute: "Compute | None" = None):
        self.args = args
        self.stop = stop
        self.progress_stream = progress_stream
        self.record_args = record_args(args)
        #: The compute settings (:mod:`.precision`): the train call's one object, in training and
        #: evaluation alike.
        self.compute = compute or Compute.of(args)
        self.device = pick_device(args.device)
        self.scaler = None  # fp16's gradient scaler (set by :meth:`prepare_compute`)
        self.folder = args.output_dir
        self.results_path = os.path.join(self.folder, RESULTS_FILE)
        self.checkpoint_path = os.path.join(self.folder, CHECKPOINT_FILE)
        self.resuming = bool(args.resume)
        self.start_step = 0
        self.n_records = 0
        self.last_keys = None
        self.accumulated: dict[str, list[float]] = {}
        #: The splits each record evaluates (:meth:`build`), and the worker pool that makes the
        #: batches of training and evaluation (:meth:`_run`).
        self.eval_names: list[str] = []
        self.pool = None

    # build ----------------------------------------------------------------------------------------

    def build(self) -> None:
        args = self.args
        print_environment(self.device)
        print("Args:")
        for k, v in sorted(self.record_args.items()):
            print("\t{}: {}".format(k, v))
        self.hparams = hparams_lib.job_hparams(args.algorithm, args.dataset, args.hparams_seed,
                                               args.trial_seed, args.hparams)

        self.pooled = self.hparams.get("batch_sampling", "per_domain") == "pooled"
        if self.pooled:
            check_pooled(args, self.hparams)
        data = build_job_data(args, self.hparams, args.n_workers, self.compute)
        self.dataset, self.splits, self.workers = data.dataset, data.splits, data.workers
        print(f"Data: loader workers: {self.workers} ({data.source})")
        cache_line = decoded.prepare(self.dataset, cores=max(1, self.workers),
                                     stop=self.stop, stopped=Interrupted)
        if cache_line:  # image-folder datasets: the decoded-image cache, built or reused
            print(cache_line)
        print_hparams(args.algorithm, self.dataset.input_shape, self.hparams)
        self.train_envs = [i for i in range(len(self.dataset)) if i not in args.test_envs]
        self.eval_names = self.splits_to_evaluate()
        with recording_weights() as loaded:
            self.algorithm = self.make_algorithm()
        print_weights(loaded)
        self.algorithm.to(self.device)
        self.streams = self.make_streams(self.batch_size())
        self.n_steps = self.length()
        self.checkpoint_freq = args.checkpoint_freq or self.dataset.CHECKPOINT_FREQ
        self.steps_per_epoch = self.epoch_length()
        self.algorithm.epoch_steps = self.steps_per_epoch
        self.prepare_compute()

    def prepare_compute(self) -> None:
        """Apply the compute settings to the built algorithm (:mod:`.precision`): its memory
        format, fp16's gradient scaler (every optimizer stepped through it), cuDNN's flags (after
        the build's last ``seed_everything``), with a note where the device runs them slowly."""
        note = self.compute.device_note(self.device)
        if note:
            print(note)
        self.compute.prepare_model(self.algorithm)
        self.scaler = self.compute.make_scaler(self.device)
        if self.scaler is not None:
            guard_scaled_steps(self.algorithm, fix=FP16_FIX)
        self.compute.configure_backends()

    def eval_splits(self) -> str:
        """``--eval_splits`` (its default for a namespace without it, e.g. a record's args)."""
        return flag(self.args, "eval_splits")

    def splits_to_evaluate(self) -> list[str]:
        """The splits every record evaluates (``--eval_splits``,
        :func:`dg_plugins.job.selection.evaluated_splits`), said in out.txt when some are
        skipped."""
        named = [name for name, _, _ in self.splits.eval_named()]
        names = evaluated_splits(self.eval_splits(), self.args.test_envs,
                                 len(self.splits.in_splits), len(self.splits.uda_splits),
                                 udg=flag(self.args, "label_fraction") is not None)
        skipped = [name for name in named if name not in names]
        if skipped:
            print(f"Evaluation: --eval_splits {self.eval_splits()}: {len(names)} of "
                  f"{len(named)} splits at every record ({', '.join(skipped)} skipped: no "
                  "model selection reads them)")
        return names

    def evaluation_datasets(self) -> list:
        """The splits :meth:`write_record` evaluates (the job's worker pool makes their
        batches; none for a job that does not evaluate, such as the UDG pretraining)."""
        if not self.eval_names:
            return []
        return [split for name, split, _ in self.splits.eval_named() if name in self.eval_names]

    # Hooks a job kind may override (the UDG fine-tuning job, dg_plugins.train.udg, does).

    def length(self) -> int:
        """The job's steps (``--steps``, else the dataset's ``N_STEPS``)."""
        return self.args.steps or self.dataset.N_STEPS

    def epoch_length(self) -> float:
        """Steps of one epoch (a record's ``epoch``, the algorithms' epoch-based schedules): with
        ``batch_sampling`` "pooled" one pass over the union of the source splits; else, as
        DomainBed's train.py, the smallest in-split (test environments' included) over the
        batch size."""
        if self.pooled:
            return float(self.streams[0].batches_per_epoch)
        return min(len(split) / self.hparams["batch_size"] for split, _ in self.splits.in_splits)

    def make_algorithm(self):
        """The model this job trains (``--algorithm``, built for the source environments)."""
        return ALGORITHMS.get(self.args.algorithm)(
            self.dataset.input_shape, self.dataset.num_classes, len(self.train_envs),
            self.hparams)

    def batch_size(self) -> int:
        """Samples per source environment per step (``batch_sampling`` "pooled": per step)."""
        return self.hparams["batch_size"]

    def train_split(self, env: int):
        """``(split, sampling weights)`` that environment ``env``'s training stream draws from."""
        return self.splits.in_splits[env]

    def loader_workers(self, n_loaders: int) -> int:
        """Workers of the one pool that makes the batches of all ``n_loaders`` training streams
        of a job (:meth:`run` gives them one :class:`dg_plugins.train.batches.WorkerPool`): the
        job's whole worker budget."""
        return self.workers

    def make_streams(self, batch_size: int) -> list:
        """Training streams of the source environments' in-splits (one per environment, or with
        ``batch_sampling`` "pooled" one over their union), then, in domain adaptation, the uda
        streams."""
        workers = self.loader_workers(len(self.train_envs))
        streams = []
        if self.pooled:
            streams.append(batches.PooledBatches([self.train_split(i)[0] for i in self.train_envs],
                                              batch_size, seed_hash(self.args.seed, "pooled"),
                                              workers))
        else:
            for i in self.train_envs:
                split, weights = self.train_split(i)
                if batch_size > len(split):
                    print(f"note: batch_size {batch_size} exceeds env{i}'s training split "
                          f"({len(split)} samples); batches repeat samples (drawn with "
                          "replacement)", file=sys.stderr)
                streams.append(batches.BatchStream(split, batch_size,
                                                seed_hash(self.args.seed, "train", i), weights,
                                                workers))
        self.n_train_streams = len(streams)
        if self.args.task == "domain_adaptation":  # the only task that draws from them
            for k, (split, weights) in enumerate(self.splits.uda_splits):
                streams.append(batches.BatchStream(split, batch_size,
                                                seed_hash(self.args.seed, "uda", k), weights,
                                                workers))
        return streams

    # resume -----------------------------------------------------------------------------------------

    def restore(self) -> None:
        """Continue from ``checkpoint.pt`` with ``--resume`` (after checking that it was written
        by the same configuration), or start from step 0. The file is loaded once; one that cannot
        be loaded or does not fit the model is a
        :class:`~dg_plugins.train.checkpoint.DamagedCheckpoint` (:meth:`checkpoint_fix`), and
        nothing on disk is changed before every check has passed."""
        if not self.resuming:
            return
        if not os.path.exists(self.checkpoint_path):
            keep_counted_records(self.results_path, 0)
            print("No checkpoint to resume from; starting from step 0")
            return
        state = read_checkpoint(self.checkpoint_path, self.checkpoint_fix())
        diffs = checkpoint_differences(state, self.record_args, self.hparams)
        if diffs:
            raise JobStateError(
                "--resume with other arguments than the interrupted run would mix two "
                "configurations in one results file:\n  " + "\n  ".join(diffs)
                + "\nRerun with the original arguments, or start over with --force.")
        apply_checkpoint(state, self.algorithm, self.streams, self.checkpoint_path,
                         self.checkpoint_fix(), scaler=self.scaler)
        keep_counted_records(self.results_path, state["n_records"])
        self.start_step, self.n_records = state["next_step"], state["n_records"]
        self.last_keys = state["last_keys"]
        self.accumulated = state.get("accumulated", {})
        print(f"Resuming from step {self.start_step} ({self.n_records} records kept)")

    def checkpoint_fix(self) -> str:
        """What to do about a checkpoint of this job that cannot be resumed from."""
        return RESTART_FIX

    # train ------------------------------------------------------------------------------------------

    def model_input(self, x):
        """An input batch on the job's device, in the model's memory format."""
        return self.compute.model_input(x.to(self.device))

    def update(self) -> dict:
        """One step of the algorithm (``Algorithm.update``) on the next batches of the streams;
        returns its values."""
        device = self.device
        train_streams = self.streams[:self.n_train_streams]
        batches = next(train_streams[0]) if self.pooled else map(next, train_streams)
        minibatches = [(self.model_input(x), y.to(device)) for x, y in batches]
        unlabeled = ([self.model_input(next(s)[0]) for s in self.streams[self.n_train_streams:]]
                     if self.args.task == "domain_adaptation" else None)
        return self.algorithm.update(minibatches, unlabeled)

    def train_step(self, step: int) -> float:
        """:meth:`update`, timed; its values are accumulated until the next record, and a
        non-finite one stops the job. Returns the step's time in seconds."""
        start = time.time()
        if self.hparams.get("lr_schedule", "constant") != "constant":
            self.algorithm.set_lr_factor(lr_factor(self.hparams, step, self.algorithm.epoch_steps))
        with self.compute.autocast(self.device), gradient_scaling(self.scaler):
            values = self.update()
        seconds = time.time() - start
        self.accumulated.setdefault("step_time", []).append(seconds)
        for key, value in values.items():
            value = float(value)
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{self.args.algorithm}.{self.UPDATE} returned {key}={value} at step {step}; "
                    f"{self.PHASE} diverged (try a lower lr). The job stops without 'done'.")
            self.accumulated.setdefault(key, []).append(value)
        return seconds

    def is_recorded(self, step: int) -> bool:
        """Whether ``step`` ends with a record (every ``checkpoint_freq`` steps, and the last)."""
        return sizes.is_recorded(step, self.n_steps, self.checkpoint_freq)

    def records_after(self, step: int) -> int:
        """How many records the steps after ``step`` write."""
        return sizes.records_after(step, self.n_steps, self.checkpoint_freq)

    def write_record(self, step: int) -> None:
        results = {"step": step, "epoch": step / self.steps_per_epoch}
        for key, values in self.accumulated.items():
            results[key] = float(np.mean(values))
        # The training streams' worker pool makes the evaluation's batches too (one budget).
        results.update(evaluate(self.algorithm, self.splits, self.device,
                                num_workers=self.workers, names=self.eval_names,
                                batch_size=flag(self.args, "eval_batch_size"), pool=self.pool,
                                compute=self.compute))
        results["mem_gb"] = (torch.cuda.max_memory_allocated() / 2**30
                             if self.device.type == "cuda" else 0.0)
        results["num_classes"] = int(self.dataset.num_classes)
        environments = getattr(self.dataset, "ENVIRONMENTS", None)
        keys = sorted(results.keys())
        if keys != self.last_keys:
            print(format_row(keys, colwidth=12))
            self.last_keys = keys
        print(format_row([results[k] for k in keys], colwidth=12))
        results["hparams"] = self.hparams
        results["args"] = self.record_args
        if self.eval_splits() != DEFAULT_EVAL_SPLITS:
            results[EVALUATED_KEY] = list(self.eval_names)
        if environments:  # the tables' column labels where the catalog has none (ImageFolder)
            results["environments"] = [str(label) for label in environments]
        append_record(self.results_path, results)
        self.n_records += 1
        self.accumulated = {}
        if self.args.save_model_every_checkpoint:
            self.save_model(STEP_MODEL_FILE.format(step=step))

    def checkpoint(self, next_step: int) -> None:
        save_checkpoint(self.checkpoint_path, next_step=next_step, algorithm=self.algorithm,
                        streams=self.streams, n_records=self.n_records, last_keys=self.last_keys,
                        accumulated=self.accumulated, record_args=self.record_args,
                        hparams=self.hparams, scaler=self.scaler)

    def model_extras(self) -> dict:
        """Keys a job kind adds to model.pkl beside DomainBed's (none here)."""
        return {}

    def save_model(self, filename: str) -> None:
        save_model(self.args, self.algorithm, self.dataset, self.hparams, self.record_args,
                   filename, len(self.train_envs), self.model_extras())

    def save_outputs(self) -> None:
        """What a finished job leaves beside ``done``: model.pkl."""
        self.save_model(MODEL_FILE)

    def finish(self) -> None:
        self.save_outputs()
        atomic_write_bytes(os.path.join(self.folder, DONE_FILE), b"done")
        if os.path.exists(self.checkpoint_path):
            os.unlink(self.checkpoint_path)

    def close(self) -> None:
        """Shut down the job's loader workers, which make the training streams' batches and the
        evaluations' (see :mod:`dg_plugins.train.batches`)."""
        for stream in getattr(self, "streams", ()):
            stream.close()

    def run(self, stop_after_step: int | None = None) -> str:
        """Build, restore and train under the job's compute settings (:meth:`Compute.active`:
        by default torch's deterministic algorithms); the loader workers are shut down on every
        way out (done, error, NaN stop, a signal, a refused resume)."""
        with self.compute.active(self.device):
            try:
                return self._run(stop_after_step)
            finally:
                self.close()

    def start_workers(self) -> None:
        """One pool of loader workers makes every training stream's batches and every
        evaluation's (the job's budget), up to the job's last step."""
        self.pool = batches.share_workers(
            self.streams, max((s.num_workers for s in self.streams), default=0),
            datasets=self.evaluation_datasets(),
            pin_memory=batches.cuda_transfers(self.device), device=self.device)
        if self.pool is not None:
            self.pool.limit = self.n_steps

    def _run(self, stop_after_step: int | None) -> str:
        self.build()
        self.start_workers()
        self.restore()
        progress = Progress(self.n_steps, self.start_step, self.records_after,
                            f"{self.args.algorithm} on {self.args.dataset}",
                            stream=self.progress_stream, interval=self.progress_interval())
        try:
            for step in range(self.start_step, self.n_steps):
                seconds = self.train_step(step)
                for hook in STEP_HOOKS:
                    hook(self, step)
                recorded = self.is_recorded(step)
                if recorded:
                    start = time.monotonic()
                    self.write_record(step)
                    progress.evaluated(time.monotonic() - start)
                progress.stepped(step, seconds)
                # after the last step the job finishes at once (model.pkl, done): no checkpoint
                # (killed before done, it resumes from the one before, to the same records)
                final = step == self.n_steps - 1 and stop_after_step is None
                if (recorded and not final) or self.stop.signum is not None:
                    self.checkpoint(step + 1)
                if self.stop.signum is not None:
                    raise Interrupted.after_step(self.stop.signum, step)
                if recorded and stop_after_step is not None and step >= stop_after_step:
                    return "stopped"
        finally:
            progress.close()
        self.finish()
        return "done"

    def progress_interval(self) -> float:
        """Seconds between two plain progress lines (``--progress_every``)."""
        value = flag(self.args, "progress_every")
        return DEFAULT_INTERVAL_S if value is None else value


def check_pooled(args, hparams: dict) -> None:
    """What ``batch_sampling`` "pooled" cannot be combined with (a clear error, not a silent
    other run)."""
    if hparams.get("class_balanced"):
        raise ValueError("hparam batch_sampling 'pooled' draws every item once per epoch (the "
                         "DMG release's loader), which class_balanced sampling cannot follow; "
                         "use one of them")
    if flag(args, "label_fraction") is not None:
        raise ValueError("hparam batch_sampling 'pooled' is not supported with the UDG protocol "
                         "(--label_fraction): its pretraining draws one batch per source "
                         "environment; use 'per_domain'")


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
