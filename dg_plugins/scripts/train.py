"""``python -m dg_plugins.scripts.train``: one DomainBed-compatible training job.

DomainBed's flags and defaults (``domainbed/scripts/train.py``) plus ``--device``, ``--resume``,
``--force``, ``--n_workers``, the IP/OOP evaluation flags and the UDG flags (``--label_fraction``,
``--pretrain_steps``, ``--udg_pretrain_epochs``, ``--udg_ft_epochs``, ``--udg_split``, ``--udg_pretrain_dir``,
``--udg_pretrain``; see
:mod:`dg_plugins.engine.udg_jobs`). Exit status: 0 done; 2 bad input
(unknown algorithm or dataset, malformed or unknown --hparams, test_envs out of range or repeated,
missing data, an output folder that cannot be written, a folder that is done, busy or holds
another run, a damaged checkpoint on --resume), with a one-line message naming the problem and
the fix; 143 / 130 stopped by SIGTERM / SIGINT (after writing a checkpoint; continue with
--resume); 1 a full disk (one line: free space, then --resume; what was written before is
intact) or any other failure (its traceback is printed once, and kept in err.txt).
"""

from __future__ import annotations

import argparse
import sys

from dg_plugins.engine import alignment_flags, udg_flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train one domain-generalization job "
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
                   help="loader worker processes (default: min(dataset.N_WORKERS, cpus); "
                   "in-memory datasets always load in-process)")
    alignment = p.add_argument_group(
        "IP/OOP evaluation", "split every test environment by CLIP alignment score and record "
        "env{i}_{in,out}_{ip,oop}_acc / _count (see python -m dg_plugins.scripts.alignment_scores)")
    alignment.add_argument("--alignment_scores", type=str, default=None,
                           help="score file (CSV) written by dg_plugins.scripts.alignment_scores")
    alignment_flags.add_rule_arguments(alignment)
    udg = p.add_argument_group(
        "unsupervised DG (UDG)", "self-supervised pretraining on the unlabelled source domains "
        "(shared by every label fraction), then fine-tuning on a labelled fraction; see "
        "dg_plugins.engine.udg_jobs")
    udg.add_argument("--label_fraction", type=float, default=None,
                     help="fine-tune on this fraction (0, 1] of each source in-split's labels "
                     "(UDG job); algorithms without pretraining (ERM) train from scratch on it")
    udg.add_argument("--pretrain_steps", type=int, default=None,
                     help="self-supervised pretraining steps (default: the dataset's N_STEPS)")
    udg_flags.add_protocol_arguments(udg)
    udg.add_argument("--udg_pretrain_dir", type=str, default=None,
                     help="where pretrainings are kept, one folder per (dataset, test_envs, "
                     "algorithm, hparams, trial, seed, steps) hash (default: "
                     "<parent of output_dir>/udg_pretrain)")
    udg.add_argument("--udg_pretrain", choices=("run", "require"), default="run",
                     help="run: pretrain when missing (or wait for the job doing it); require: "
                     "fail with a message if the pretraining is not done")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from dg_plugins.engine import train

    try:
        train.run(args)
    except train.user_errors() as err:
        if not getattr(err, "reported_in_output_dir", False):
            print(f"error: {err}", file=sys.stderr)
        return 2
    except train.DiskFullError as err:
        if not getattr(err, "reported_in_output_dir", False):
            print(f"error: {err}", file=sys.stderr)
        return 1
    except train.Interrupted as err:
        return err.exit_code
    except Exception as err:  # already printed (with its traceback) by train.run
        if not getattr(err, "reported_in_output_dir", False):
            raise
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
