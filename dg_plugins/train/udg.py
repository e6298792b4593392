"""The UDG protocol as train jobs (``--label_fraction F``; docs/udg_protocol.md): a pretraining on
the unlabelled sources shared by every label fraction (:class:`PretrainJob`, in a folder named by
its identity's md5), then fine-tuning on a fixed, nested labelled subset (:class:`UDGJob`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import signal
import sys
import time

import numpy as np
import torch

from dg_plugins.files import atomic_torch_save, atomic_write_bytes
from dg_plugins.networks.pretrained import note_weights
from dg_plugins.registry import ALGORITHMS
from dg_plugins.job.flags import compute_settings, flag
from dg_plugins.seeds import seed_everything, seed_hash
from dg_plugins.train import batches
from dg_plugins.train import loop as job_lib
from dg_plugins.train.checkpoint import check_checkpoint_file
from dg_plugins.job.folder import (FolderBusy, FolderLock, JobStateError, is_done,
                                   remove_temporary_files)
from dg_plugins.job.records import append_record, keep_counted_records
from dg_plugins.train.splits import class_balanced_weights, split_dataset

PRETRAIN_DIRNAME = "udg_pretrain"
PRETRAINED_FILE = "pretrained.pt"
IDENTITY_FILE = "identity.json"
#: What to do about a damaged pretraining checkpoint or ``pretrained.pt`` in ``{folder}``.
REDO_PRETRAINING = ("Remove the pretraining folder (rm -r {folder}) and rerun: the next job that "
                    "needs it pretrains again (no other folder is touched)")
#: Seconds between two looks at a pretraining folder another job holds.
POLL_SECONDS = 5.0
#: hparams that only affect fine-tuning (not part of the pretraining's identity).
FINETUNE_HPARAMS = ("udg_ft_lr", "udg_ft_batch_size", "udg_ft_mode")


class PretrainingMissing(FileNotFoundError):
    """``--udg_pretrain require`` and the job's pretraining is not done."""


def labelled_count(n: int, fraction: float) -> int:
    return max(1, min(n, int(round(fraction * n))))


def labelled_subset(split, fraction: float, trial_seed: int, env: int, tag: str = "udg_labels"):
    """The first ``max(1, round(F * n))`` items of a permutation drawn from ``seed_hash(trial_seed,
    env, tag)``: fixed by the trial and nested across fractions (also the release's 99% share)."""
    n = min(len(split), labelled_count(len(split), fraction))  # an empty split stays empty
    return split_dataset(split, n, seed_hash(trial_seed, env, tag))[0]


#: Share of each source environment ``--udg_split release`` pretrains on (the release's).
RELEASE_PRETRAIN_SHARE = 0.99


def steps_for_epochs(epochs: float, sizes: list[int], batch: int) -> int:
    """``ceil(epochs x`` the release's epoch ``)``, at least 1, in one division (exact)."""
    return max(1, math.ceil(epochs * sum(sizes) / (batch * len(sizes))))


def epochs_length(phase: str, kind: str, epochs: float, sizes: list[int], batch: int) -> int:
    steps = steps_for_epochs(epochs, sizes, batch)
    print(f"UDG {phase} length: {epochs:g} epochs of {sum(sizes)} {kind} images "
          f"({', '.join(map(str, sizes))} per source environment) at batch {batch} per "
          f"domain x {len(sizes)} domains = {steps} steps")
    return steps


def pretraining_set(job, env: int):
    """``env``'s unlabelled pretraining images: its in-split, or with ``--udg_split release`` 99%
    of the environment, drawn from ``seed_hash(trial_seed, env, "udg_pretrain_split")``."""
    if job.udg_split != "release":
        return job.splits.in_splits[env][0]
    return labelled_subset(job.dataset[env], RELEASE_PRETRAIN_SHARE, job.args.trial_seed, env,
                           "udg_pretrain_split")


def pretrain_identity(args, hparams: dict, pretrain_steps: int) -> dict:
    """What makes two jobs' pretrainings the same (no paths; ``udg_split`` and compute settings
    only when not default, so a default pretraining's identity stays as it was)."""
    return {
        "dataset": args.dataset, "test_envs": sorted(int(t) for t in args.test_envs),
        "algorithm": args.algorithm, "trial_seed": args.trial_seed, "seed": args.seed,
        "holdout_fraction": args.holdout_fraction, "pretrain_steps": pretrain_steps,
        "hparams": {k: v for k, v in sorted(hparams.items()) if k not in FINETUNE_HPARAMS},
        **({"udg_split": "release"} if flag(args, "udg_split") == "release" else {}),
        **compute_settings(args)}


def pretrain_key(identity: dict) -> str:
    return hashlib.md5(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def pretrain_root(args) -> str:
    return flag(args, "udg_pretrain_dir") or os.path.join(
        os.path.dirname(os.path.abspath(args.output_dir.rstrip(os.sep))), PRETRAIN_DIRNAME)


def _done(folder: str) -> bool:
    return is_done(folder) and os.path.exists(os.path.join(folder, PRETRAINED_FILE))


def load_pretrained(folder: str, identity: dict) -> dict:
    """The pretrained weights of a finished pretraining folder, after checking its identity."""
    with open(os.path.join(folder, IDENTITY_FILE)) as f:
        if json.load(f) != json.loads(json.dumps(identity)):
            raise JobStateError(f"{folder} holds another pretraining than this job's (identity "
                                "differs); move it away or pass another --udg_pretrain_dir")
    path = os.path.join(folder, PRETRAINED_FILE)
    check_checkpoint_file(path, REDO_PRETRAINING.format(folder=folder))
    state = torch.load(path, map_location="cpu", weights_only=False)
    note_weights(f"the UDG pretraining {path}")
    return state["state"]


class PretrainJob(job_lib.Job):
    """The pretraining (``pretrain_update`` on unlabelled batches, output ``pretrained.pt``), run
    under its folder's lock; it continues from any checkpoint (checked against the identity)."""

    UPDATE = "pretrain_update"
    PHASE = "pretraining"

    def __init__(self, parent: "UDGJob", folder: str, identity: dict):
        super().__init__(parent.args, parent.stop, compute=parent.compute, folder=folder)
        self.parent, self.identity, self.record_args = parent, identity, identity
        self.checkpoint_fix = REDO_PRETRAINING.format(folder=folder)
        self.resuming = True

    def build_data(self) -> None:
        remove_temporary_files(self.folder)
        atomic_write_bytes(os.path.join(self.folder, IDENTITY_FILE),
                           json.dumps(self.identity, sort_keys=True, indent=1).encode())
        seed_everything(seed_hash(self.args.seed, "udg_pretrain"))
        # The checkpoint is checked against the identity's hparams: jobs that share this
        # pretraining may differ in their fine-tuning hparams.
        self.dataset, self.train_envs = self.parent.dataset, self.parent.train_envs
        self.hparams = self.identity["hparams"]

    def make_algorithm(self):
        return job_lib.Job.make_algorithm(self.parent)  # the job's algorithm, its hparams

    def make_streams(self, batch_size: int) -> list:
        p = self.parent
        sets = [pretraining_set(p, i) for i in p.train_envs]
        # the release's epoch: one pass over the pooled sets at `batch_size` per domain
        self.epoch = sum(map(len, sets)) / (batch_size * len(sets))
        print(f"UDG pretraining data ({p.udg_split} split): "
              f"{', '.join(str(len(s)) for s in sets)} unlabelled images per source environment; "
              f"an epoch is {self.epoch:.1f} steps")
        self.n_train_streams = len(sets)
        return [batches.BatchStream(s, batch_size, seed_hash(p.args.seed, "udg_pretrain", i),
                                    num_workers=p.workers) for s, i in zip(sets, p.train_envs)]

    def length(self) -> int:
        return self.identity["pretrain_steps"]

    def epoch_length(self) -> float:
        return self.epoch

    def restore(self) -> None:
        if os.path.exists(self.checkpoint_path):
            print(f"UDG pretraining: continuing {self.folder} from its checkpoint")
            super().restore()
        else:  # records of a run killed before its first checkpoint
            keep_counted_records(self.results_path, 0)

    def update(self) -> dict:
        return self.algorithm.pretrain_update([self.model_input(next(s)[0]) for s in self.streams])

    def write_record(self, step: int) -> None:
        record = {"step": step, **{k: float(np.mean(v)) for k, v in self.accumulated.items()},
                  "udg_pretrain": self.identity}
        append_record(self.results_path, record)
        self.n_records += 1
        self.accumulated = {}
        print(f"UDG pretraining step {step}: " + ", ".join(
            f"{k} {v:.4f}" for k, v in record.items() if isinstance(v, float)))

    def save_outputs(self) -> None:
        state = {k: v.cpu() for k, v in self.algorithm.pretrained_state().items()}
        atomic_torch_save({"identity": self.identity, "state": state},
                          os.path.join(self.folder, PRETRAINED_FILE))


class UDGJob(job_lib.Job):
    """A UDG job: the shared pretraining, then fine-tuning on the labelled fraction."""

    def build(self) -> None:
        self.fraction = float(self.args.label_fraction)
        self.udg_split = flag(self.args, "udg_split") or "domainbed"
        self.pretraining = ALGORITHMS.get(self.args.algorithm).supports_pretraining()
        self.labelled = {}
        super().build()

    def labelled_sizes(self) -> list[int]:
        return [len(self.train_split(i)[0]) for i in self.train_envs]

    def epoch_length(self) -> float:
        return min(self.labelled_sizes()) / self.batch_size()

    def length(self) -> int:
        """``--steps``, or ``--udg_ft_epochs`` of the release's (``train_finetune.py``)."""
        if (epochs := flag(self.args, "udg_ft_epochs")) is None:
            return super().length()
        return epochs_length("fine-tuning", "labelled", epochs, self.labelled_sizes(),
                             self.batch_size())

    def train_split(self, env: int):
        if env not in self.labelled:
            subset = labelled_subset(self.splits.in_splits[env][0], self.fraction,
                                     self.args.trial_seed, env)
            self.labelled[env] = (subset, class_balanced_weights(subset)
                                  if self.hparams["class_balanced"] else None)
        return self.labelled[env]

    def batch_size(self) -> int:
        return self.finetune[2] if self.pretraining else self.hparams["batch_size"]

    def make_algorithm(self):
        if not self.pretraining:
            print(f"UDG: {self.args.algorithm} has no self-supervised phase: trained from its "
                  f"own initialisation on the labelled {self.fraction * 100:g}% of the source data")
            return super().make_algorithm()
        from dg_plugins.algorithms.udg_finetune import FineTuner, finetune_settings

        self.finetune = finetune_settings(self.fraction, self.hparams)
        resuming = self.args.resume and os.path.exists(self.checkpoint_path)
        state = None if resuming else self.pretrained_weights()
        seed_everything(seed_hash(self.args.seed, "udg_finetune"))
        cls = ALGORITHMS.get(self.args.algorithm)
        backbone = cls.build_finetune_encoder(self.dataset.input_shape, self.hparams)
        if state is not None:
            backbone.load_state_dict(state, strict=True)  # exactly the pretrained keys
        mode, lr, batch = self.finetune
        # model.pkl says what its state dict is: the fine-tuner's, not the algorithm's
        self.model_extras = {"udg": {"label_fraction": self.fraction, "mode": mode,
                                     "model": "dg_plugins.algorithms.udg_finetune.FineTuner"}}
        kind = "linear probe, frozen backbone" if mode == "linear" else "full fine-tuning"
        print(f"UDG fine-tuning: {kind}, lr {lr:g}, batch {batch} per domain, label fraction "
              f"{self.fraction:g} ({', '.join(map(str, self.labelled_sizes()))} labelled "
              "samples per source environment)")
        return FineTuner(self.dataset.input_shape, self.dataset.num_classes,
                         len(self.train_envs), self.hparams, backbone, self.fraction)

    def pretrained_weights(self) -> dict:
        args = self.args
        steps = flag(args, "pretrain_steps") or self.dataset.N_STEPS
        if (epochs := flag(args, "udg_pretrain_epochs")) is not None:
            steps = epochs_length("pretraining", "unlabelled", epochs,
                                  [len(pretraining_set(self, i)) for i in self.train_envs],
                                  self.hparams["batch_size"])
        identity = pretrain_identity(args, self.hparams, steps)
        folder = os.path.join(pretrain_root(args), pretrain_key(identity))
        for attempt in itertools.count():
            if _done(folder):
                print(f"UDG pretraining: reusing {folder}")
                return load_pretrained(folder, identity)
            if flag(args, "udg_pretrain") == "require":
                state = "missing" if not os.path.isdir(folder) else "not finished"
                raise PretrainingMissing(
                    f"the UDG pretraining of this job is {state}: {folder} (identity: "
                    f"{json.dumps(identity, sort_keys=True)}). Run this job (or any label fraction "
                    "of the same sweep) without --udg_pretrain require to pretrain, or point "
                    "--udg_pretrain_dir at the folder that holds it.")
            os.makedirs(folder, exist_ok=True)
            try:
                with FolderLock(folder):
                    if not _done(folder):
                        print(f"UDG pretraining: not found; running {steps} steps in {folder} "
                              "(shared by every label fraction of this configuration)")
                        PretrainJob(self, folder, identity).run()
                    return load_pretrained(folder, identity)
            except FolderBusy:
                if not attempt:  # the first wait
                    print(f"UDG pretraining: {folder} is being pretrained by another job; "
                          "waiting for it", file=sys.stderr)
                deadline = time.monotonic() + POLL_SECONDS
                while self.stop.signum is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if (signum := self.stop.signum) is not None:  # waiting: nothing to resume
                    raise job_lib.Interrupted(signum, f"stopped by {signal.Signals(signum).name} "
                                              f"while waiting for the UDG pretraining in {folder} "
                                              "(another job runs it); this job had not started, so "
                                              "there is nothing to resume: rerunning the same "
                                              "command (with or without --resume) continues, "
                                              "reusing or finishing that pretraining")
