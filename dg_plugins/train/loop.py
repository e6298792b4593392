"""The step loop of every kind of job (``domainbed/scripts/train.py``'s): build, restore from the
resume file, train; every ``checkpoint_freq`` steps evaluate, append a record and write the resume
file; at the end save the model and mark the folder done. alignment_eval shares build_job_data."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from collections import namedtuple
from importlib.metadata import version

import numpy as np
import PIL
import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.algorithms.base import gradient_scaling, guard_scaled_steps, lr_factor
from dg_plugins.datasets import decoded
from dg_plugins.datasets.device_augment import use_device_augmentation
from dg_plugins.files import atomic_torch_save, atomic_write_bytes
from dg_plugins.job import sizes
from dg_plugins.job.flags import flag, record_args
from dg_plugins.job.folder import (CHECKPOINT_FILE, DONE_FILE, MODEL_FILE, RESULTS_FILE,
                                   STEP_MODEL_FILE)
from dg_plugins.job.records import append_record, format_row, keep_counted_records
from dg_plugins.job.selection import DEFAULT_EVAL_SPLITS, EVALUATED_KEY, evaluated_splits
from dg_plugins.networks.pretrained import recording_weights
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.runtime import pick_device
from dg_plugins.seeds import seed_everything, seed_hash
from dg_plugins.train import batches
from dg_plugins.train.checkpoint import RESTART_FIX, restore_checkpoint, save_checkpoint
from dg_plugins.train.compute import FP16_FIX, Compute
from dg_plugins.train.evaluate import evaluate
from dg_plugins.train.progress import DEFAULT_INTERVAL_S, Progress
from dg_plugins.train.splits import Splits

#: ``hook(job, step)`` called after every step, before its record, checkpoint and stop check (a
#: plugin module may log; tests/support/job_gate.py holds a job at a step).
STEP_HOOKS: list = []


def add_step_hook(hook) -> None:
    if hook not in STEP_HOOKS:
        STEP_HOOKS.append(hook)


class NonFiniteLossError(FloatingPointError):
    pass


class Interrupted(Exception):
    """SIGTERM/SIGINT stopped the job at a safe point; train exits with ``128 + signum``."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def check_test_envs(args, environments) -> None:
    n_envs = len(environments)
    if bad := [t for t in args.test_envs if not 0 <= t < n_envs]:
        raise ValueError(f"--test_envs {bad} out of range: {args.dataset} has {n_envs} "
                         f"environments {list(environments)} (valid indices 0..{n_envs - 1})")
    if len(set(args.test_envs)) >= n_envs:
        raise ValueError(f"--test_envs {args.test_envs} leaves no training environment in "
                         f"{args.dataset} ({n_envs} environments)")


#: The base hparams that configure a network: listed only where the job's network reads them.
MODEL_HPARAMS = frozenset({"backbone", "vit", "resnet18", "resnet50_augmix", "resnet_dropout",
                           "freeze_bn", "dinov2", "vit_arch", "vit_attn_tune", "vit_dropout",
                           "mnist_cnn_width", "pretrained", "pretrained_path",
                           "nonlinear_classifier"})
#: DomainBed's base hparams that no dg_plugins algorithm or network reads.
UNREAD_HPARAMS = frozenset({"lars", "linear_steps"})


def shown_hparams(algorithm: str, input_shape, hparams: dict) -> tuple[list[str], list[str]]:
    """``(listed, left out)`` names of ``hparams`` in train's "HParams:" printout, sorted: all but
    :data:`UNREAD_HPARAMS` and the network hparams its network does not read (records keep all)."""
    from dg_plugins.algorithms.base import FeatureClassifier
    from dg_plugins.algorithms.dismae import MAE, DisMAE
    from dg_plugins.algorithms.gmoe import ERM_ViT
    from dg_plugins.networks.featurizers import backbone_for, resnet_arch

    cls, used = ALGORITHMS.get(algorithm), {"backbone", "nonlinear_classifier"}
    if issubclass(cls, ERM_ViT):  # GMoE too: gmoe.build_vit
        used = {"vit_arch", "pretrained", "pretrained_path"}
    elif issubclass(cls, (DisMAE, MAE)):  # dismae.build_encoder: random initialisation
        used = {"vit_arch"}
    elif not issubclass(cls, FeatureClassifier):
        return sorted(hparams), []
    else:
        try:
            choice = backbone_for(input_shape, hparams)
        except ValueError:
            return sorted(hparams), []
        if choice == "mnist_cnn":
            used.add("mnist_cnn_width")
        elif choice == "resnet":
            arch_flag = "resnet18" if resnet_arch(hparams) == "resnet18" else "resnet50_augmix"
            used |= {arch_flag, "resnet_dropout", "freeze_bn", "pretrained", "pretrained_path"}
        elif choice == "vit":
            used |= {"dinov2", "vit_attn_tune", "vit_dropout", "pretrained", "pretrained_path"}
            if not hparams.get("dinov2"):
                used.add("vit_arch")
            if hparams.get("backbone", "auto") == "auto":
                used.add("vit")  # DomainBed's switch chose it
    left_out = {name for name in hparams
                if name in UNREAD_HPARAMS or name in MODEL_HPARAMS and name not in used}
    return sorted(set(hparams) - left_out), sorted(left_out)


#: A job's dataset, splits and loader workers (``source``: why that many).
JobData = namedtuple("JobData", "dataset splits workers source")


def build_job_data(args, hparams: dict, n_workers: int | None = None,
                   compute: "Compute | None" = None) -> JobData:
    """The dataset, splits and loader workers of the job of ``args`` (train's, or a record's), RNGs
    seeded first (Debug28 draws its data then)."""
    seed_everything(args.seed)
    dataset = DATASETS.get(args.dataset)(args.data_dir, args.test_envs, hparams)
    if (compute or Compute.of(args)).augment_on == "device":
        use_device_augmentation(dataset, args.dataset)
    check_test_envs(args, getattr(dataset, "ENVIRONMENTS", None) or range(len(dataset)))
    splits = Splits(dataset, args, hparams)
    if getattr(dataset, "IN_MEMORY", False):
        return JobData(dataset, splits, 0, "in-memory dataset, loaded in-process")
    if n_workers is None and dataset.N_WORKERS == 0:
        return JobData(dataset, splits, 0, f"{args.dataset}'s N_WORKERS is 0")
    return JobData(dataset, splits, *batches.worker_budget(n_workers))


class Job:
    """One training run (the UDG jobs are kinds of Job); ``stop``: a signals.StopRequest."""

    #: The algorithm's method a step calls and the phase it trains (named when a loss diverges).
    UPDATE = "update"
    PHASE = "training"
    #: Whether one stream draws pooled batches (``batch_sampling`` "pooled"; set by :meth:`build`).
    pooled = False

    def __init__(self, args, stop, progress_stream=None, compute: "Compute | None" = None,
                 folder: str | None = None):
        self.args, self.stop, self.progress_stream = args, stop, progress_stream
        self.record_args = record_args(args)
        self.compute = compute or Compute.of(args)
        self.device = pick_device(args.device)
        self.folder = folder or args.output_dir
        self.results_path = os.path.join(self.folder, RESULTS_FILE)
        self.checkpoint_path = os.path.join(self.folder, CHECKPOINT_FILE)
        self.checkpoint_fix = RESTART_FIX  # what to do about a checkpoint that cannot resume
        self.resuming = bool(args.resume)
        self.start_step = self.n_records = 0
        self.scaler = self.last_keys = self.pool = None  # scaler: fp16's (:meth:`prepare_compute`)
        self.accumulated: dict[str, list[float]] = {}
        self.model_extras: dict = {}  # keys a job kind adds to model.pkl beside DomainBed's
        self.eval_names: list[str] = []

    def build(self) -> None:
        """The job's data (:meth:`build_data`), then its algorithm, streams and lengths."""
        self.build_data()
        with recording_weights() as loaded:
            self.algorithm = self.make_algorithm()
        for line in loaded or ["random initialisation (no pretrained weights loaded)"]:
            print(f"Weights: {line}")
        self.algorithm.to(self.device)
        self.streams = self.make_streams(self.batch_size())
        self.n_steps = self.length()
        self.checkpoint_freq = self.args.checkpoint_freq or self.dataset.CHECKPOINT_FREQ
        self.algorithm.epoch_steps = self.steps_per_epoch = self.epoch_length()
        self.prepare_compute()

    def build_data(self) -> None:
        args, device = self.args, self.device
        shown = (torch.device("cuda", torch.cuda.current_device())  # which GPU (multi_gpu: 0)
                 if device.type == "cuda" and device.index is None else device)
        gpu = f" ({torch.cuda.get_device_name(shown)})" if shown.type == "cuda" else ""
        print("Environment:", *[f"\t{name}: {value}" for name, value in (
            ("Python", sys.version.split(" ")[0]), ("PyTorch", torch.__version__),
            ("Torchvision", version("torchvision")), ("CUDA", torch.version.cuda),
            ("CUDNN", torch.backends.cudnn.version()), ("NumPy", np.__version__),
            ("PIL", PIL.__version__), ("Device", f"{shown}{gpu}"))], sep="\n")
        print("Args:", *[f"\t{k}: {v}" for k, v in sorted(self.record_args.items())], sep="\n")
        self.hparams = hparams_lib.job_hparams(args.algorithm, args.dataset, args.hparams_seed,
                                               args.trial_seed, args.hparams)

        self.pooled = self.hparams.get("batch_sampling", "per_domain") == "pooled"
        if self.pooled and self.hparams.get("class_balanced"):
            raise ValueError("hparam batch_sampling 'pooled' draws every item once per epoch (the "
                             "DMG release's loader), which class_balanced sampling cannot "
                             "follow; use one of them")
        if self.pooled and flag(args, "label_fraction") is not None:
            raise ValueError("hparam batch_sampling 'pooled' is not supported with the UDG "
                             "protocol (--label_fraction): its pretraining draws one batch per "
                             "source environment; use 'per_domain'")
        self.dataset, self.splits, self.workers, source = build_job_data(
            args, self.hparams, args.n_workers, self.compute)
        print(f"Data: loader workers: {self.workers} ({source})")
        # image-folder datasets: the decoded-image cache, built or reused
        if cache_line := decoded.prepare(self.dataset, cores=max(1, self.workers),
                                         stop=self.stop, stopped=Interrupted):
            print(cache_line)
        # DomainBed's "HParams:" block of the listed names, then the others on one line
        listed, left_out = shown_hparams(args.algorithm, self.dataset.input_shape, self.hparams)
        print("HParams:", *[f"\t{name}: {self.hparams[name]}" for name in listed], sep="\n")
        if left_out:
            print(f"\t(in the records, not read by this job: {', '.join(left_out)})")
        self.train_envs = [i for i in range(len(self.dataset)) if i not in args.test_envs]
        # the splits every record evaluates (--eval_splits), said when some are skipped
        named = [name for name, _, _ in self.splits.eval_named()]
        self.eval_names = evaluated_splits(flag(args, "eval_splits"), args.test_envs,
                                           len(self.splits.in_splits), len(self.splits.uda_splits),
                                           udg=flag(args, "label_fraction") is not None)
        if skipped := [name for name in named if name not in self.eval_names]:
            print(f"Evaluation: --eval_splits {flag(args, 'eval_splits')}: {len(self.eval_names)} "
                  f"of {len(named)} splits at every record ({', '.join(skipped)} skipped: no "
                  "model selection reads them)")

    def prepare_compute(self) -> None:
        """Apply the compute settings to the built algorithm (after the last seeding)."""
        if note := self.compute.device_note(self.device):
            print(note)
        self.compute.prepare_model(self.algorithm)
        self.scaler = self.compute.make_scaler(self.device)
        if self.scaler is not None:
            guard_scaled_steps(self.algorithm, fix=FP16_FIX)
        self.compute.configure_backends()

    # Hooks a job kind may override (the UDG fine-tuning job, dg_plugins.train.udg, does).

    def length(self) -> int:
        return self.args.steps or self.dataset.N_STEPS

    def epoch_length(self) -> float:
        """Steps of one epoch: pooled, one pass over the sources' union; else, as DomainBed's
        train.py, the smallest in-split (test environments' included) over the batch size."""
        return (float(self.streams[0].batches_per_epoch) if self.pooled else
                min(len(split) / self.hparams["batch_size"] for split, _ in self.splits.in_splits))

    def make_algorithm(self):
        data = self.dataset
        return ALGORITHMS.get(self.args.algorithm)(data.input_shape, data.num_classes,
                                                   len(self.train_envs), self.hparams)

    def batch_size(self) -> int:
        """Samples per source environment per step (``batch_sampling`` "pooled": per step)."""
        return self.hparams["batch_size"]

    def train_split(self, env: int):
        """``(split, sampling weights)`` that environment ``env``'s training stream draws from."""
        return self.splits.in_splits[env]

    def make_streams(self, batch_size: int) -> list:
        seed, workers, streams = self.args.seed, self.workers, []
        if self.pooled:
            streams.append(batches.PooledBatches([self.train_split(i)[0] for i in self.train_envs],
                                                 batch_size, seed_hash(seed, "pooled"), workers))
        else:
            for i in self.train_envs:
                split, weights = self.train_split(i)
                if batch_size > len(split):
                    print(f"note: batch_size {batch_size} exceeds env{i}'s training split "
                          f"({len(split)} samples); batches repeat samples (drawn with "
                          "replacement)", file=sys.stderr)
                streams.append(batches.BatchStream(split, batch_size, seed_hash(seed, "train", i),
                                                   weights, workers))
        self.n_train_streams = len(streams)
        if self.args.task == "domain_adaptation":  # the only task that draws from them
            streams += [batches.BatchStream(s, batch_size, seed_hash(seed, "uda", k), w, workers)
                        for k, (s, w) in enumerate(self.splits.uda_splits)]
        return streams

    def restore(self) -> None:
        """With ``--resume``, continue from the checkpoint of the same configuration (checked
        before anything on disk changes)."""
        if not self.resuming:
            return
        if not os.path.exists(self.checkpoint_path):
            keep_counted_records(self.results_path, 0)
            print("No checkpoint to resume from; starting from step 0")
            return
        state = restore_checkpoint(self)
        keep_counted_records(self.results_path, state["n_records"])
        self.start_step, self.n_records = state["next_step"], state["n_records"]
        self.last_keys, self.accumulated = state["last_keys"], state.get("accumulated", {})
        print(f"Resuming from step {self.start_step} ({self.n_records} records kept)")

    def model_input(self, x):
        return self.compute.model_input(x.to(self.device))

    def update(self) -> dict:
        streams, n = self.streams, self.n_train_streams
        drawn = next(streams[0]) if self.pooled else map(next, streams[:n])
        minibatches = [(self.model_input(x), y.to(self.device)) for x, y in drawn]
        unlabeled = ([self.model_input(next(s)[0]) for s in streams[n:]]
                     if self.args.task == "domain_adaptation" else None)
        return self.algorithm.update(minibatches, unlabeled)

    def train_step(self, step: int) -> float:
        """:meth:`update`, timed, its values accumulated (a non-finite one stops the job)."""
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
                raise NonFiniteLossError(f"{self.args.algorithm}.{self.UPDATE} returned {key}="
                                         f"{value} at step {step}; {self.PHASE} diverged (try a "
                                         "lower lr). The job stops without 'done'.")
            self.accumulated.setdefault(key, []).append(value)
        return seconds

    def write_record(self, step: int) -> None:
        results = {"step": step, "epoch": step / self.steps_per_epoch,
                   **{key: float(np.mean(values)) for key, values in self.accumulated.items()}}
        # The training streams' worker pool makes the evaluation's batches too (one budget).
        results.update(evaluate(self.algorithm, self.splits, self.device, num_workers=self.workers,
                                names=self.eval_names, pool=self.pool, compute=self.compute,
                                batch_size=flag(self.args, "eval_batch_size")))
        results["mem_gb"] = (torch.cuda.max_memory_allocated() / 2**30
                             if self.device.type == "cuda" else 0.0)
        results["num_classes"] = int(self.dataset.num_classes)
        keys = sorted(results.keys())
        if keys != self.last_keys:
            print(format_row(keys, colwidth=12))
            self.last_keys = keys
        print(format_row([results[k] for k in keys], colwidth=12))
        results.update(hparams=self.hparams, args=self.record_args)
        if flag(self.args, "eval_splits") != DEFAULT_EVAL_SPLITS:
            results[EVALUATED_KEY] = list(self.eval_names)
        if getattr(self.dataset, "ENVIRONMENTS", None):  # labels the catalog lacks (ImageFolder)
            results["environments"] = [str(label) for label in self.dataset.ENVIRONMENTS]
        append_record(self.results_path, results)
        self.n_records += 1
        self.accumulated = {}
        if self.args.save_model_every_checkpoint:
            self.save_model(STEP_MODEL_FILE.format(step=step))

    def save_model(self, filename: str) -> None:
        """DomainBed's model.pkl plus :attr:`model_extras`, written atomically."""
        if not self.args.skip_model_save:
            atomic_torch_save({
                "args": self.record_args, "model_input_shape": self.dataset.input_shape,
                "model_num_classes": self.dataset.num_classes,
                "model_num_domains": len(self.train_envs), "model_hparams": self.hparams,
                "model_dict": self.algorithm.state_dict(), **self.model_extras,
            }, os.path.join(self.args.output_dir, filename))

    def save_outputs(self) -> None:
        self.save_model(MODEL_FILE)

    def finish(self) -> None:
        self.save_outputs()
        atomic_write_bytes(os.path.join(self.folder, DONE_FILE), b"done")
        if os.path.exists(self.checkpoint_path):
            os.unlink(self.checkpoint_path)

    def close(self) -> None:
        for stream in getattr(self, "streams", ()):
            stream.close()

    def run(self, stop_after_step: int | None = None) -> str:
        """Build, restore and train under the compute settings; the workers end on every way out."""
        with self.compute.active(self.device), contextlib.closing(self):
            self.build()
            self.start_workers()
            self.restore()
            interval = flag(self.args, "progress_every")
            with contextlib.closing(Progress(
                    self.n_steps, self.start_step,
                    lambda step: sizes.records_after(step, self.n_steps, self.checkpoint_freq),
                    f"{self.args.algorithm} on {self.args.dataset}", self.progress_stream,
                    DEFAULT_INTERVAL_S if interval is None else interval)) as progress:
                for step in range(self.start_step, self.n_steps):
                    seconds = self.train_step(step)
                    for hook in STEP_HOOKS:
                        hook(self, step)
                    recorded = sizes.is_recorded(step, self.n_steps, self.checkpoint_freq)
                    if recorded:
                        start = time.monotonic()
                        self.write_record(step)
                        progress.evaluated(time.monotonic() - start)
                    progress.stepped(step, seconds)
                    # no checkpoint after the last step (model.pkl and done follow at once;
                    # killed before done, it resumes from the one before, to the same records)
                    final = step == self.n_steps - 1 and stop_after_step is None
                    if (recorded and not final) or self.stop.signum is not None:
                        save_checkpoint(self, step + 1)
                    if (signum := self.stop.signum) is not None:
                        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} "
                                          f"after step {step}; a checkpoint was written: rerun "
                                          "the same command with --resume to continue")
                    if recorded and stop_after_step is not None and step >= stop_after_step:
                        return "stopped"
            self.finish()
            return "done"

    def start_workers(self) -> None:
        evaluated = [split for name, split, _ in self.splits.eval_named()
                     if name in self.eval_names] if self.eval_names else []
        self.pool = batches.share_workers(
            self.streams, max((s.num_workers for s in self.streams), default=0), datasets=evaluated,
            pin_memory=batches.cuda_transfers(self.device), device=self.device)
        if self.pool is not None:
            self.pool.limit = self.n_steps
