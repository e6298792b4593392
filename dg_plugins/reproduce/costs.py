"""The jobs of a ``sweep launch`` call, enumerated as sweep does without launching, and their cost
(:mod:`dg_plugins.sweep.costs`): training steps (UDG pretraining shared), image forwards of
training and evaluation, GPU time."""

from __future__ import annotations

from dataclasses import dataclass, field

from dg_plugins.reproduce.plan import Plan
from dg_plugins.sweep import jobs as sweep_lib
from dg_plugins.sweep.cli import sweep_jobs
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


def call_cost(argv: list[str], pretrainings: set | None = None, evaluated=None,
              forwards: bool = True) -> CallCost:
    """The jobs of a ``sweep launch`` argv, their steps and (``forwards``) image forwards
    (:func:`dg_plugins.sweep.costs.jobs_cost`; ``evaluated``: the rule of the splits a record
    evaluates, default the train job's own). A UDG pretraining counts with the first job that
    needs it; its identity is then added to ``pretrainings`` (one set for the calls of one
    listing)."""
    args, jobs = sweep_jobs(argv, dry_run=True, defer_scores=True)
    selected = sweep_lib.select_jobs(jobs, "launch", resume=args.resume)
    counted = jobs_cost([job.train_args for job in jobs], pretrainings, evaluated, forwards)
    return CallCost(jobs, selected, counted.steps, counted.pretrain_steps, args.resume,
                    counted.origins, counted.forwards)


def plan_costs(plan: Plan) -> list[CallCost]:
    """The jobs of every sweep call of ``plan`` (enumerated, nothing launched; no forwards)."""
    return [call_cost(call.argv, forwards=False) for call in plan.calls]
