"""train's command line: the parser (DomainBed's flags and defaults, ours, and the compute, IP/OOP
and UDG groups of :mod:`.flags`) and :func:`main`, the command: parse, then run the job
(:mod:`.run`, imported only then, so that this module stays torch-free for the sweep that forks
jobs)."""

from __future__ import annotations

import argparse

from dg_plugins.train.flags import (add_compute_arguments, add_evaluation_arguments,
                                    add_protocol_arguments,
                                    add_rule_arguments)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train.py",
                                description="Train one domain-generalization job "
                                "(DomainBed-compatible output folder).")
    p.add_argument("--data_dir", type=str)
    p.add_argument("--dataset", type=str, default="RotatedMNIST")
    p.add_argument("--algorithm", type=str, default="ERM")
    p.add_argument("--task", type=str, default="domain_generalization",
                   choices=["domain_generalization", "domain_adaptation"])
    p.add_argument("--hparams", type=str, help="JSON-serialized hparams dict")
    p.add_argument("--hparams_seed", type=int, default=0,
                   help="Seed for random hparams (0 means 'default hparams')")
    p.add_argument("--trial_seed", type=int, default=0,
                   help="Trial number (used for seeding split_dataset and random_hparams).")
    p.add_argument("--seed", type=int, default=0, help="Seed for everything else")
    p.add_argument("--steps", type=int, default=None,
                   help="Number of steps. Default is dataset-dependent.")
    p.add_argument("--checkpoint_freq", type=int, default=None,
                   help="Checkpoint every N steps. Default is dataset-dependent.")
    p.add_argument("--test_envs", type=int, nargs="+", default=[0])
    p.add_argument("--output_dir", type=str, default="train_output")
    p.add_argument("--holdout_fraction", type=float, default=0.2)
    p.add_argument("--uda_holdout_fraction", type=float, default=0,
                   help="For domain adaptation, %% of test to use unlabeled for training.")
    p.add_argument("--skip_model_save", action="store_true")
    p.add_argument("--save_model_every_checkpoint", action="store_true")
    # dg_plugins additions
    p.add_argument("--device", type=str, default=None,
                   help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted job from output_dir/checkpoint.pt (the same "
                   "arguments and hparams are required)")
    p.add_argument("--force", action="store_true",
                   help="start the job over even if output_dir holds a finished or interrupted "
                   "run (its done, records, models and checkpoint are removed first)")
    p.add_argument("--progress_every", type=float, default=None, metavar="SECONDS",
                   help="when the output is not a terminal (a log file, a sweep's job), a "
                   "progress line (step, steps/s, time left) every SECONDS (default 60; a "
                   "terminal gets a progress bar)")
    p.add_argument("--n_workers", type=int, default=None,
                   help="loader worker processes, shared by training and evaluation "
                   "(default: one per core the job has: $DG_PLUGINS_CPUS, which the multi_gpu "
                   "launcher sets, else Slurm's cpus-per-task, else the cores the process may "
                   "run on; in-memory datasets always load in-process)")
    compute = p.add_argument_group(
        "compute (opt-in speed for GPUs)", "each setting at another value than its default "
        "enters the records' args (and a sweep's job folder hash) and is noted under "
        "collect_results' tables; see dg_plugins.train.precision")
    add_compute_arguments(compute)
    add_evaluation_arguments(p.add_argument_group(
        "evaluation", "what each record evaluates (DomainBed's defaults: every split, batches "
        "of 64)"))
    alignment = p.add_argument_group(
        "IP/OOP evaluation", "split every test environment by CLIP alignment score and record "
        "env{i}_{in,out}_{ip,oop}_acc / _count (see python -m dg_plugins.scripts.alignment_scores)")
    alignment.add_argument("--alignment_scores", type=str, default=None,
                           help="score file (CSV) written by dg_plugins.scripts.alignment_scores")
    add_rule_arguments(alignment)
    udg = p.add_argument_group(
        "unsupervised DG (UDG)", "self-supervised pretraining on the unlabelled source domains "
        "(shared by every label fraction), then fine-tuning on a labelled fraction; see "
        "dg_plugins.train.udg")
    udg.add_argument("--label_fraction", type=float, default=None,
                     help="fine-tune on this fraction (0, 1] of each source in-split's labels "
                     "(UDG job); algorithms without pretraining (ERM) train from scratch on it")
    add_protocol_arguments(udg, "self-supervised pretraining steps (default: the dataset's "
                           "N_STEPS)")
    udg.add_argument("--udg_pretrain_dir", type=str, default=None,
                     help="where pretrainings are kept, one folder per (dataset, test_envs, "
                     "algorithm, hparams, trial, seed, steps) hash (default: "
                     "<parent of output_dir>/udg_pretrain)")
    udg.add_argument("--udg_pretrain", choices=("run", "require"), default="run",
                     help="run: pretrain when missing (or wait for the job doing it); require: "
                     "fail with a message if the pretraining is not done")
    return p


def main(argv=None) -> int:
    """``python -m dg_plugins.scripts.train``: parse, run the job, return its exit status."""
    args = build_parser().parse_args(argv)
    from dg_plugins.train import run

    return run.main(args)
