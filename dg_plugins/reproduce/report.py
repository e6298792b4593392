"""What reproduce prints without launching: a setting's dry run (calls, jobs, commands, steps,
forwards, GPU-hours, tables), the ``--list`` and ``--list --forwards`` tables and
``--dry_run_sweeps`` (the ``DRY_RUN=1`` listing of the offline scripts in sweeps/)."""

from __future__ import annotations

import shlex
import sys

from dg_plugins.reference import gpu_times
from dg_plugins.reference import paper_settings as ps
from dg_plugins.reproduce.costs import CallCost, call_cost
from dg_plugins.reproduce.plan import Plan, plan_setting
from dg_plugins.reproduce.prerequisites import prerequisites, report_prerequisites
from dg_plugins.sweep import jobs as sweep_lib
from dg_plugins.sweep.costs import (EVAL_SPLITS, FORWARDS_DEFINITION, UsageError,
                                    evaluation_share, forwards_text, gpu_hours_definition,
                                    gpu_hours_text, gpu_line, missing_lines, sum_forwards,
                                    sum_gpu)
from dg_plugins.sweep.plan import split_calls


def module_line(module: str, argv: list[str]) -> str:
    """The command line of ``python -m dg_plugins.scripts.<module> argv``, quoted."""
    return shlex.join([sys.executable, "-m", f"dg_plugins.scripts.{module}", *argv])


def dry_run(plan: Plan, data_dir: str) -> int:
    """Print what running ``plan`` would do and cost, then its missing prerequisites as
    warnings; launch and write nothing."""
    setting, protocol = plan.setting, plan.protocol
    print(f"== {setting.name} ({setting.script}), protocol {protocol.name}: {protocol.summary}")
    print(f"   paper: {setting.paper}, {setting.table}")
    for note in plan.notes:
        print(f"   note: {note}")
    print(f"   differences from the source: {len(protocol.differences)} (reproduce "
          f"{setting.name} --protocol {protocol.name} --describe lists them)")
    for argv in plan.prepare:
        print(f"-- score: {module_line('alignment_scores', argv)}")
    costs = list_calls([(call.argv, f": {call.label}") for call in plan.calls])
    for argv in plan.collects:
        print(f"-- tables: {module_line('collect_results', argv)}")
    print("Dry run: nothing launched or written.", flush=True)
    problems = prerequisites(plan, data_dir, costs)
    if problems:
        report_prerequisites(plan, problems, dry=True)
    return 0


def list_calls(calls: list[tuple[list[str], str]], check=None) -> list[CallCost]:
    """Print each sweep call (argv, label) with its jobs and cost (after ``check(i, argv)``),
    then the totals."""
    costs, pretrainings = [], set()
    for i, (argv, label) in enumerate(calls, 1):
        if check is not None:
            check(i, argv)
        print(f"-- sweep {i}/{len(calls)}{label}")
        print(f"$ {module_line('sweep', argv)}")
        costs.append(call_cost(argv, pretrainings))
        print_call(costs[-1])
    print(total_line(costs))
    return costs


def print_call(cost: CallCost) -> None:
    """The sweep's dry-run listing (jobs, commands) and the call's count and steps."""
    for job in cost.jobs:
        print(job)
    print(sweep_lib.summary_line(cost.jobs))
    for job in cost.selected:
        print(job.command(resume=cost.resume and job.state == sweep_lib.INCOMPLETE))
    line = f"{len(cost.jobs)} jobs, {sum(cost.steps)} training steps"
    if cost.pretrain_steps:
        line += (f" + {sum(cost.pretrain_steps.values())} pretraining steps "
                 f"({len(cost.pretrain_steps)} pretrainings shared by the label fractions)")
    print(line)
    for origin in sorted(cost.origins):
        print(f"  image counts: {origin}")
    print("Image forwards per job (train; evaluation with --eval_splits selection / all):")
    for job, forwards in zip(cost.jobs, cost.forwards):
        note = "".join(f" [{text}]" for text in (forwards.note, forwards.unknown) if text)
        print(f"  {job.describe()}: {forwards_text(forwards.train, forwards.evaluation)}{note}")
    print(f"{len(cost.jobs)} jobs, image forwards: "
          f"{forwards_text(*sum_forwards(cost.forwards))}; {runs_with(cost.jobs)}")
    print(f"{len(cost.jobs)} jobs, GPU-hours (estimate): {gpu_line(sum_gpu(cost.forwards))}")


def total_line(costs: list[CallCost]) -> str:
    """The totals of a listing's calls: jobs, steps, image forwards, GPU-hours."""
    jobs, steps, pretrainings = totals(costs)
    line = f"Total: {jobs} jobs, {steps} training steps"
    if pretrainings:
        line += f" + {sum(pretrainings.values())} pretraining steps"
    to_run = sum(len(c.selected) for c in costs)
    if to_run != jobs:
        line += f" ({to_run} jobs to launch, the others done or incomplete)"
    items = [f for c in costs for f in c.forwards]
    train, evaluation = sum_forwards(items)
    shares = ", ".join(f"{evaluation_share(evaluation[v], train)} with {v}" for v in EVAL_SPLITS)
    gpu = sum_gpu(items)
    return "\n".join([
        line, f"Total image forwards: {forwards_text(train, evaluation)}; evaluation share "
        f"{shares}; {runs_with([j for c in costs for j in c.jobs])}", FORWARDS_DEFINITION,
        f"Total GPU-hours (estimate): {gpu_line(gpu)}", *missing_lines(gpu),
        gpu_hours_definition()])


def totals(costs: list[CallCost]) -> tuple[int, int, dict]:
    """The jobs, training steps and UDG pretrainings (identity -> steps) of a listing's calls."""
    pretrainings = {}
    for c in costs:
        pretrainings.update(c.pretrain_steps)
    return sum(len(c.jobs) for c in costs), sum(sum(c.steps) for c in costs), pretrainings


def settings_costs(data_dir: str | None, forwards: bool):
    """``(setting, protocol, costs of its calls)`` of every setting and protocol, planned with
    placeholder folders (image counts under ``data_dir`` when given)."""
    for setting in ps.SETTINGS.values():
        for protocol in setting.protocols.values():
            plan = plan_setting(setting, protocol, data_dir=data_dir or "DATA_DIR",
                                output_dir="OUTPUT_DIR", count_dir=data_dir)
            pretrainings: set = set()
            yield setting, protocol, [call_cost(call.argv, pretrainings, forwards=forwards)
                                      for call in plan.calls]


def runs_with(jobs) -> str:
    """``the jobs run with --eval_splits V`` (each value with its count when they differ)."""
    values = [job.command_args.get("eval_splits", job.train_args.get("eval_splits", "all"))
              for job in jobs]
    if not values:
        return "no jobs"
    if len(set(values)) == 1:
        return f"the jobs run with --eval_splits {values[0]}"
    return "the jobs run with " + ", ".join(f"--eval_splits {v} ({values.count(v)})"
                                            for v in sorted(set(values)))


def list_settings(data_dir: str | None, forwards: bool = False) -> int:
    """One row per setting and protocol: script, paper table, jobs, total steps, paper rows;
    with ``forwards`` the image forwards instead (:func:`list_forwards`)."""
    if forwards:
        return list_forwards(data_dir)
    print("| setting | script | paper table | protocol | jobs | total steps | paper rows |")
    print("|---|---|---|---|---|---|---|")
    for setting, protocol, costs in settings_costs(data_dir, forwards=False):
        jobs, steps, pretrain = totals(costs)
        steps_text = f"{steps:,}" + (f" + {sum(pretrain.values()):,} pretraining"
                                     if pretrain else "")
        keys = ", ".join(dict.fromkeys(k for g in protocol.groups for k in g.paper_keys))
        print(f"| {setting.name} | {setting.script} | {setting.table} | {protocol.name} | "
              f"{jobs} | {steps_text} | {keys} |")
    return 0


def _millions(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1e6:,.1f}M"


def list_forwards(data_dir: str | None) -> int:
    """One row per setting and protocol: jobs, the image forwards of training and of evaluation
    with ``--eval_splits selection`` and ``all``, each evaluation's share of the total, and the
    totals (train + evaluation); the image counts are those under ``data_dir`` when given, else
    the recorded full-size counts. Datasets whose counts are unknown are named under the
    table."""
    device = gpu_times.load().device
    print(FORWARDS_DEFINITION)
    print("| setting | script | protocol | jobs | train | evaluation, selection | evaluation, "
          "all | evaluation share, selection / all | image forwards (train + eval), selection "
          f"(all) | GPU-hours ({device}), selection | GPU-hours ({device}), all |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    unknown, left_out = {}, {}
    for setting, protocol, costs in settings_costs(data_dir, forwards=True):
        where = f"{setting.name} ({protocol.name})"
        items = [f for c in costs for f in c.forwards]
        for f in items:
            if f.unknown:
                unknown.setdefault(f.unknown, set()).add(where)
        train, evaluation = sum_forwards(items)
        known = [f for f in items if not f.unknown]
        _, counted = sum_forwards(known)
        eval_text = [_millions(evaluation[v]) if evaluation[v] is not None else
                     f"{_millions(counted[v])} + unknown" if known else "unknown"
                     for v in EVAL_SPLITS]
        share = " / ".join(evaluation_share(evaluation[v], train) for v in EVAL_SPLITS)
        totals_text = (f"{_millions(train + evaluation['selection'])} "
                       f"({_millions(train + evaluation['all'])})"
                       if train is not None and evaluation["all"] is not None else "unknown")
        gpu = sum_gpu(items)
        for name, (tag, why) in gpu.missing.items():
            left_out.setdefault((name, f"{tag}: {why}"), set()).add(where)
        print(f"| {setting.name} | {setting.script} | {protocol.name} | {len(items)} | "
              f"{_millions(train)} | {eval_text[0]} | {eval_text[1]} | {share} | "
              f"{totals_text} | {gpu_hours_text(gpu, 'selection')} | "
              f"{gpu_hours_text(gpu, 'all')} |")
    for why, where in unknown.items():
        print(f"unknown evaluation forwards in {', '.join(sorted(where))}: {why}")
    print(gpu_hours_definition())
    for (name, why), where in sorted(left_out.items()):
        print(f"left out of the GPU-hours: {name} ({why}) in {', '.join(sorted(where))}")
    return 0


def dry_run_sweeps(tokens: list[str]) -> int:
    """List the jobs, count and total steps of plain sweep calls (``::``-separated)."""
    calls = split_calls(tokens)
    if not calls:
        raise UsageError("--dry_run_sweeps needs sweep calls: launch FLAGS [:: launch FLAGS ...]")

    def check(i: int, argv: list[str]) -> None:
        if argv[0] != "launch":
            raise UsageError(f"--dry_run_sweeps: call {i} must start with 'launch', got "
                             f"{argv[0]!r}")

    list_calls([(argv, "") for argv in calls], check)
    print("Dry run: nothing launched or written.")
    return 0
