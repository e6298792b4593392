"""sweep's command line (``domainbed/scripts/sweep.py``'s flags and defaults, plus ours), its
checks, and :func:`main`: enumerate the jobs, build the launcher, act."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Sequence

from dg_plugins.catalog import DATASET_ENVIRONMENTS
from dg_plugins.help_text import CommandParser
from dg_plugins.hparams import HparamError, parse_overrides
from dg_plugins import plugins
from dg_plugins.registry import ALGORITHMS, LAUNCHERS, UnknownNameError
from dg_plugins.signals import DEFAULT_STOP_GRACE_PERIOD_S, STOP_GRACE_PERIOD_ENV
from dg_plugins.sweep import actions, checks, jobs
from dg_plugins.sweep.launchers import launch_problem, with_options  # registers ours
from dg_plugins.sweep.submitit import (DEFAULT_MAX_REQUEUES, DEFAULT_SIGNAL_DELAY_S,
                                       SUBMITIT_CLUSTERS, SUBMITIT_ENV_VARS, SubmititOptions,
                                       parse_json_object)
from dg_plugins.job import flags as job_flags

TASKS = ("domain_generalization", "domain_adaptation")
PROG = "python -m dg_plugins.scripts.sweep"
#: The usage line an error shows (argparse's own lists every flag: 45 lines above the error).
SHORT_USAGE = (f"{PROG} {{{','.join(actions.ACTIONS)}}} --data_dir DIR --output_dir DIR "
               "[--datasets NAME ...] [--algorithms NAME ...] [--command_launcher NAME] "
               "[FLAGS] (every flag: --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=PROG, short_usage=SHORT_USAGE,
        description="Enumerate, launch or delete the jobs of a DomainBed-style sweep. Two "
        "launches of one sweep at once share it: a launch claims the job folders it creates "
        "until each job ends, and another launch (or a delete) leaves a live launcher's jobs "
        "alone, naming it (pid, host), and runs only the jobs no live launcher holds.")
    parser.add_argument("command", choices=list(actions.ACTIONS), help="launch: start Not "
                        "launched jobs (+ Incomplete ones with --resume); delete_incomplete: "
                        "remove Incomplete job folders; delete_all: remove every existing folder "
                        "of this sweep's jobs (nothing else); status: each job's state (done, "
                        "running, held by Slurm, failed with its error line, not launched); "
                        "cancel: scancel the Slurm jobs that hold this sweep's jobs")
    # DomainBed's flags (domainbed/scripts/sweep.py)
    parser.add_argument("--datasets", nargs="+", help="default: every catalog dataset without "
                        "'Debug' in its name (DomainBed's rule)")
    parser.add_argument("--algorithms", nargs="+",
                        help="default: every algorithm registered in dg_plugins")
    parser.add_argument("--task", default="domain_generalization", choices=TASKS)
    parser.add_argument("--n_hparams_from", type=int, default=0)
    parser.add_argument("--n_hparams", type=int, default=20,
                        help="exclusive upper bound of hparams_seed (as DomainBed), not a count")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data_dir", required=True,
                        help="passed verbatim; the string is part of each job's identity")
    parser.add_argument("--seed", type=int, default=0, help="seeds the launch order")
    parser.add_argument("--n_trials", type=int, default=3)
    parser.add_argument("--command_launcher",
                        help="a registered launcher: " + ", ".join(_launcher_names()))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--hparams",
                        help="JSON object passed verbatim to train (part of the job identity)")
    parser.add_argument("--holdout_fraction", type=float, default=0.2)
    parser.add_argument("--single_test_envs", action="store_true")
    parser.add_argument("--skip_confirmation", action="store_true")
    # dg_plugins additions
    extra = parser.add_argument_group("dg_plugins additions")
    extra.add_argument("--single_source", action="store_true", help="train on one environment "
                       "and test on all others: one job per source environment")
    extra.add_argument("--checkpoint_freq", type=int,
                       help="passed to train (hashed only when given)")
    extra.add_argument("--uda_holdout_fraction", type=float, help="passed to train (hashed only "
                       "when given); needed by --task domain_adaptation")
    # the train flags passed to every job (hashed or not, when given and not their defaults:
    # dg_plugins.job.flags.FLAGS), some with the sweep's own help
    job_flags.add_flags(extra, "alignment", metavar={"alignment_scores": "FILE"}, help={
        "alignment_scores": "IP/OOP evaluation: a score file of dg_plugins.scripts."
        "alignment_scores, passed to every job (records get env{i}_{in,out}_{ip,oop}_acc)"})
    job_flags.add_flags(extra, "compute")
    job_flags.add_flags(extra, "evaluation")
    job_flags.ROWS["n_workers"].add_to(extra, help="every job's loader workers (default: one per "
                                       "core the job has; the multi_gpu launcher divides the "
                                       "machine's cores among the jobs it runs at once); records "
                                       "do not depend on it, so it is not hashed")
    extra.add_argument("--jobs_per_gpu", type=int, metavar="N", help="multi_gpu launcher: run N "
                       "jobs at once on each GPU (default 1); before packing it checks that N "
                       "jobs' peak memory (their records' mem_gb, else the first job's) fits in "
                       "the GPU's free memory; submitit launcher on Slurm: N jobs per array task, "
                       "sharing its allocation")
    extra.add_argument("--resume", action="store_true", help="launch also relaunches Incomplete "
                       "jobs, with --resume appended to their commands (jobs a live train process "
                       "or another live launcher holds are left alone)")
    extra.add_argument("--stop_grace_period", type=float, metavar="SECONDS", help="after SIGTERM/"
                       "SIGINT, how long the local and multi_gpu launchers wait for running jobs "
                       f"to stop at a checkpoint before SIGKILL (default ${STOP_GRACE_PERIOD_ENV} "
                       f"or {DEFAULT_STOP_GRACE_PERIOD_S:g}); the sweep then exits with 128 + the "
                       "signal number (143 SIGTERM, 130 SIGINT)")
    extra.add_argument("--test_env_sets", nargs="+", metavar="I,J,..", help="explicit test-"
                       "environment sets, e.g. '0,1,2' '3,4,5' (instead of DomainBed's "
                       "combinations; hashed like any test_envs)")
    udg = parser.add_argument_group(
        "unsupervised DG (UDG)", "pretrain once per configuration on the unlabelled source "
        "domains, fine-tune per label fraction (see dg_plugins.train.udg)")
    udg.add_argument("--label_fractions", nargs="+", type=float,
                     help="one UDG job per fraction in (0, 1], e.g. 0.01 0.05 0.1 1.0")
    job_flags.add_flags(udg, "udg", skip=("label_fraction", "udg_pretrain_dir", "udg_pretrain"),
                        help={"pretrain_steps": "UDG pretraining steps passed to every job "
                              "(hashed only when given)"})
    extra.add_argument("--dry_run", action="store_true", help="print the jobs and the commands to "
                       "launch (or folders to delete) without creating, deleting or asking "
                       "anything")
    slurm = parser.add_argument_group(
        "submitit launcher", "each flag overrides the DG_SLURM_<NAME> environment variable")
    slurm.add_argument("--slurm_cluster", choices=SUBMITIT_CLUSTERS,
                       help="submitit backend (default slurm; local/debug run on this machine)")
    slurm.add_argument("--slurm_partition")
    slurm.add_argument("--slurm_time", type=int, help="time limit per task in minutes (default "
                       "1440, or the partition's MaxTime if lower); a job longer than its "
                       "allocation is requeued from its checkpoint")
    slurm.add_argument("--slurm_gpus_per_node", type=int, help="default on Slurm: 1 on a "
                       "partition with GPUs, else 0; 0 on local/debug")
    slurm.add_argument("--slurm_cpus_per_task", type=int)
    slurm.add_argument("--slurm_mem_gb", type=float)
    slurm.add_argument("--slurm_array_parallelism", type=int,
                       help="max array tasks running at once (default 256)")
    slurm.add_argument("--slurm_log_dir", help="submitit logs (default <output_dir>/submitit_logs)")
    slurm.add_argument("--slurm_wait", action="store_const", const=True,
                       help="wait for the jobs (default on local/debug)")
    slurm.add_argument("--slurm_no_wait", dest="slurm_wait", action="store_const", const=False,
                       help="return after submission (default on Slurm)")
    slurm.add_argument("--slurm_signal_delay", type=float, metavar="SECONDS", help="Slurm signals "
                       "a task this long before its time limit; its jobs stop at a checkpoint and "
                       f"the task is requeued (default {DEFAULT_SIGNAL_DELAY_S})")
    slurm.add_argument("--slurm_max_requeues", type=int, help="time limits after which a task is "
                       f"requeued (default {DEFAULT_MAX_REQUEUES}; preemptions are requeued by "
                       "Slurm)")
    slurm.add_argument("--slurm_extra", help='JSON object of more executor parameters, e.g. '
                       '\'{"slurm_account": "abc", "slurm_qos": "high"}\'')
    return parser


def _launcher_names(name: str | None = None) -> list[str]:
    """The registered launchers (those of the plugin modules too when ``name`` is none of ours)."""
    if name is not None and name not in LAUNCHERS:
        plugins.load(builtins=False)
    return LAUNCHERS.list()


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject bad combinations with a message naming the value and the fix (``parser.error``)."""
    fractions, per_gpu = args.label_fractions, args.jobs_per_gpu
    for bad, message in (  # the first that applies is the error
        (args.n_hparams <= args.n_hparams_from, f"--n_hparams ({args.n_hparams}) must be greater "
         f"than --n_hparams_from ({args.n_hparams_from}): hparams seeds run over "
         "range(n_hparams_from, n_hparams)"),
        (args.n_hparams_from < 0, f"--n_hparams_from must be >= 0, got {args.n_hparams_from}"),
        (args.n_trials < 1, f"--n_trials must be >= 1, got {args.n_trials}"),
        (args.task == "domain_adaptation" and not args.uda_holdout_fraction, "--task "
         "domain_adaptation needs --uda_holdout_fraction > 0 (train has no unlabeled target "
         "data otherwise)"),
        (args.single_source and args.single_test_envs,
         "--single_source and --single_test_envs are mutually exclusive"),
        (args.stop_grace_period is not None and not args.stop_grace_period >= 0,
         f"--stop_grace_period must be >= 0 seconds, got {args.stop_grace_period}"),
        (args.n_workers is not None and args.n_workers < 0, f"--n_workers must be >= 0, got "
         f"{args.n_workers} (0: load in each job's process; leave it out for one worker per "
         "core)"),
        (per_gpu is not None and per_gpu < 1, f"--jobs_per_gpu must be >= 1, got {per_gpu}"),
        (per_gpu is not None and args.command_launcher not in ("multi_gpu", "submitit"),
         "--jobs_per_gpu packs jobs on the GPUs of the multi_gpu launcher or in the Slurm tasks "
         "of the submitit launcher; add --command_launcher multi_gpu or submitit (got "
         f"{args.command_launcher or 'no launcher'})"),
        (fractions is not None and (any(not 0 < f <= 1 for f in fractions)
                                    or len(set(fractions)) != len(fractions)),
         f"--label_fractions must be distinct values in (0, 1], got {fractions}")):
        if bad:
            parser.error(message)
    try:  # the train flags' ranges and --hparams, with train's checks and messages
        job_flags.check_ranges(args, args.label_fractions, "--label_fractions")
        if args.test_env_sets is not None:
            try:
                args.test_env_sets = [[int(e) for e in text.split(",") if e.strip()]
                                      for text in args.test_env_sets]
            except ValueError:
                parser.error(f"--test_env_sets takes comma-separated indices such as 0,1,2; "
                             f"got {args.test_env_sets}")
            if args.single_source or args.single_test_envs:
                parser.error("--test_env_sets replaces --single_source/--single_test_envs")
        parse_overrides(args.hparams)
    except ValueError as err:
        parser.error(str(err))
    if args.slurm_signal_delay is not None and not args.slurm_signal_delay > 0:
        parser.error(f"--slurm_signal_delay must be > 0 seconds, got {args.slurm_signal_delay}")
    if args.slurm_max_requeues is not None and args.slurm_max_requeues < 0:
        parser.error(f"--slurm_max_requeues must be >= 0, got {args.slurm_max_requeues}")
    if args.slurm_extra is not None:
        try:
            parse_json_object(args.slurm_extra)
        except ValueError as err:  # JSONDecodeError is a ValueError
            parser.error(f"--slurm_extra must be a JSON object: {err}")
    if args.alignment_scores is not None:
        if not os.path.isfile(args.alignment_scores):
            parser.error(f"--alignment_scores {args.alignment_scores!r} is not a file; write one "
                         "with python -m dg_plugins.scripts.alignment_scores")
        args.alignment_scores = os.path.abspath(args.alignment_scores)
    try:
        for dataset in args.datasets:
            jobs.check_dataset_name(dataset)
        args.algorithms = checks.check_algorithms(args.algorithms)  # erm: ERM
        checks.check_hparams(args.hparams, args.algorithms, args.datasets)
        for dataset in args.datasets:  # e.g. ImageFolder: its environments are found on disk
            jobs.num_environments(dataset, args.data_dir)
    except (UnknownNameError, HparamError, ValueError, FileNotFoundError) as err:
        parser.error(" ".join(str(err).split()))
    if args.command == "launch" and args.command_launcher is None and not args.dry_run:
        parser.error("launch needs --command_launcher; choices: " + ", ".join(_launcher_names()))
    if args.command_launcher is not None and args.command_launcher not in _launcher_names(
            args.command_launcher):
        parser.error(f"unknown --command_launcher {args.command_launcher!r}; choices: "
                     + ", ".join(_launcher_names()))
    if args.command == "launch" and args.command_launcher is not None and not args.dry_run:
        if problem := launch_problem(args.command_launcher, slurm_options(args)):  # no folder yet
            parser.error(f"--command_launcher {args.command_launcher}: {problem}")


def slurm_options(args: argparse.Namespace) -> SubmititOptions:
    """The ``--slurm_*`` flags given (``--slurm_NAME`` for ``DG_SLURM_NAME``)."""
    given = {name: getattr(args, "slurm_" + var.removeprefix("DG_SLURM_").lower(), None)
             for name, var in SUBMITIT_ENV_VARS.items()}
    return SubmititOptions(**{
        **given, "extra": parse_json_object(args.slurm_extra) if args.slurm_extra else None,
        "jobs_per_task": args.jobs_per_gpu if args.command_launcher == "submitit" else None})


def make_args_list(args: argparse.Namespace) -> list[dict]:
    """The train args of every job of a parsed, validated sweep command line."""
    return jobs.make_args_list(
        args.n_trials, args.datasets, args.algorithms, args.n_hparams_from, args.n_hparams,
        None, args.data_dir, args.task, args.holdout_fraction, args.single_test_envs, None,
        single_source=args.single_source, test_env_sets=args.test_env_sets,
        extra_args={**{name: getattr(args, name) for name in job_flags.names(
            sweep=job_flags.OPTIONAL)}, **job_flags.sweep_job_args(args, hashed=True)},
        label_fractions=args.label_fractions,
        n_envs=lambda dataset: jobs.num_environments(dataset, args.data_dir))


def command_args(args: argparse.Namespace) -> dict:
    """The flags every job's command carries unhashed (``--eval_splits``, ``--n_workers``)."""
    return job_flags.sweep_job_args(args, hashed=False)


def sweep_jobs(argv: Sequence[str], dry_run: bool = False, defer_scores: bool = False,
               parser: argparse.ArgumentParser | None = None):
    """``(args, jobs)`` of a sweep argv, checked (``defer_scores``: a score file yet to make)."""
    parser = parser or build_parser()
    args = parser.parse_args(list(argv) + (["--dry_run"] if dry_run else []))
    if args.datasets is None:  # DomainBed's: every catalog dataset whose name lacks "Debug"
        args.datasets = [name for name in DATASET_ENVIRONMENTS if "Debug" not in name]
    if args.algorithms is None:  # every one registered, plugins included (imports torch)
        plugins.load()
        args.algorithms = ALGORITHMS.list()
    scores = args.alignment_scores
    deferred = defer_scores and scores is not None and not os.path.isfile(scores)
    saved = {name: getattr(args, name) for name in job_flags.ALIGNMENT_ARGS}
    if deferred:  # validate the rest; the score file's own flags need the file
        vars(args).update(dict.fromkeys(saved))
    validate(parser, args)
    if deferred:
        vars(args).update(saved, alignment_scores=os.path.abspath(scores))
    return args, jobs.make_jobs(make_args_list(args), args.output_dir,
                                command_args=command_args(args))


@contextlib.contextmanager
def usage_errors(parser: argparse.ArgumentParser):
    """Bad sweep input (a flag's value, a plugin, a file) as ``parser.error``: exit status 2."""
    try:
        yield
    except plugins.PluginImportError as err:
        parser.error(str(err))
    except (ValueError, FileNotFoundError) as err:
        parser.error(" ".join(str(err).split()))


def run_jobs(args: argparse.Namespace, enumerated: Sequence, command_line) -> int:
    """:func:`actions.run_action` on ``enumerated`` as the flags ``args`` say (the exit status)."""
    from dg_plugins.sweep import costs  # not at import: the estimate's child runs it as __main__

    launcher_fn = None if args.command_launcher is None else with_options(  # with its flags
        LAUNCHERS.get(args.command_launcher), grace_period_s=args.stop_grace_period,
        submitit=slurm_options(args), jobs_per_gpu=args.jobs_per_gpu)
    return actions.run_action(
        args.command, enumerated, launcher_fn=launcher_fn, seed=args.seed,
        resume=args.resume, dry_run=args.dry_run, skip_confirmation=args.skip_confirmation,
        command_line=command_line, check=checks.launch_problems,
        estimate=lambda selected: costs.print_estimate(selected, args.command_launcher))


def main(argv: list[str] | None = None) -> int:
    """The sweep's exit status (docs/sweep.md)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    with usage_errors(parser):
        args, enumerated = sweep_jobs(argv, parser=parser)
    return run_jobs(args, enumerated, argv)
