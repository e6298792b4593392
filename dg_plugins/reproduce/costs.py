"""The jobs of a ``sweep launch`` call, enumerated as sweep does without launching, and their cost
(:mod:`dg_plugins.sweep.costs`): training steps (UDG pretraining shared), image forwards of
training and evaluation, GPU time."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dg_plugins.job import flags as job_flags
from dg_plugins.reproduce.plan import Plan
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep import jobs as sweep_lib
from dg_plugins.sweep.costs import jobs_cost


@dataclass
class CallCost:
    """The jobs of one sweep call and their steps."""
    jobs: list
    selected: list  # the jobs a launch would start (Not launched, + Incomplete with --resume)
    steps: list[int]  # per job
    pretrain_steps: dict  # pretraining identity -> steps (UDG: run once, shared)
    resume: bool
    origins: set = field(default_factory=set)
    forwards: list = field(default_factory=list)  # per job: Forwards


def sweep_jobs(argv: list[str], dry_run: bool = True):
    """``(args, jobs)`` of a ``sweep launch`` argv, enumerated exactly as
    :func:`dg_plugins.scripts.sweep.main` does (same parser, checks and ``make_args_list``), without
    launching or writing. ``dry_run``: as ``--dry_run`` checks (a missing ``--alignment_scores``
    file, scores not computed yet, is allowed; its job args hold the path as the sweep would);
    else as a launch checks (the launcher can launch from here, the score file exists)."""
    parser = sweep_cli.build_parser()
    args = parser.parse_args(list(argv) + (["--dry_run"] if dry_run else []))
    if args.datasets is None:
        args.datasets = sweep_lib.default_datasets()
    if args.algorithms is None:
        args.algorithms = sweep_lib.default_algorithms()
    scores = args.alignment_scores
    deferred = dry_run and scores is not None and not os.path.isfile(scores)
    if deferred:  # validate the rest; the score file's own flags need the file
        saved = {name: getattr(args, name) for name in job_flags.ALIGNMENT_ARGS}
        for name in saved:
            setattr(args, name, None)
    sweep_cli.validate(parser, args)
    if deferred:
        for name, value in saved.items():
            setattr(args, name, value)
        args.alignment_scores = os.path.abspath(scores)
    args_list = sweep_cli.make_args_list(args)
    return args, sweep_lib.make_jobs(args_list, args.output_dir,
                                     command_args=sweep_cli.command_args(args))


def call_cost(argv: list[str], pretrainings: set | None = None, evaluated=None,
              forwards: bool = True) -> CallCost:
    """The jobs of a ``sweep launch`` argv, their steps and (``forwards``) image forwards
    (:func:`dg_plugins.sweep.costs.jobs_cost`; ``evaluated``: the rule of the splits a record
    evaluates, default the train job's own). A UDG pretraining counts with the first job that
    needs it; its identity is then added to ``pretrainings`` (one set for the calls of one
    listing)."""
    args, jobs = sweep_jobs(argv)
    selected = sweep_lib.select_jobs(jobs, "launch", resume=args.resume)
    counted = jobs_cost([job.train_args for job in jobs], pretrainings, evaluated, forwards)
    return CallCost(jobs, selected, counted.steps, counted.pretrain_steps, args.resume,
                    counted.origins, counted.forwards)


def plan_costs(plan: Plan) -> list[CallCost]:
    """The jobs of every sweep call of ``plan`` (enumerated, nothing launched; no forwards)."""
    return [call_cost(call.argv, forwards=False) for call in plan.calls]
