"""``python -m dg_plugins.scripts.reproduce``: the flags, and the flow from a setting to its run
(scores, sweeps, tables), or what it prints without launching: a setting's dry run, the ``--list``
and ``--list --forwards`` tables and ``--dry_run_sweeps`` (the ``DRY_RUN=1`` listing of the
offline scripts in sweeps/). What it does: docs/reproduce.md."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from dg_plugins import runtime
from dg_plugins.files import atomic_write_bytes
from dg_plugins.hparams import parse_overrides
from dg_plugins.job import borrow
from dg_plugins.reference import gpu_times
from dg_plugins.reference import paper_settings as ps
from dg_plugins.reproduce.plan import (CallCost, Plan, call_cost, check_extra, parse_test_env_sets,
                                       plan_setting, prerequisites, report_prerequisites)
from dg_plugins.sweep import jobs as sweep_lib
from dg_plugins.sweep.costs import (EVAL_SPLITS, FORWARDS_DEFINITION, UsageError,
                                    evaluation_share, forwards_text, gpu_hours_definition,
                                    gpu_hours_text, gpu_line, missing_lines, sum_forwards,
                                    sum_gpu)
from dg_plugins.sweep import plan as sweep_plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dg_plugins.scripts.reproduce",
        description="Run a paper setting (dg_plugins/reference/paper_settings.py): its sweeps, "
                    "then its tables beside the paper's rows. Extra arguments are sweep flags "
                    "passed to every sweep call.")
    parser.add_argument("setting", nargs="?", help="one of: " + ", ".join(ps.SETTINGS))
    parser.add_argument("--protocol", choices=ps.PROTOCOLS, default=None,
                        help="release (the official release's protocol) or domainbed "
                             "(DomainBed's protocol with the paper's hparams); default: release "
                             "where the paper has a release")
    parser.add_argument("--data_dir", default=None, help="the data folder (required to launch)")
    parser.add_argument("--output_dir", default=None,
                        help="the protocol's sweeps go to OUTPUT_DIR/<protocol> (default: "
                             "sweep_output/<setting>)")
    parser.add_argument("--command_launcher", default="local",
                        help="sweep launcher (local, multi_gpu, submitit, ...; default local)")
    parser.add_argument("--dry_run", action="store_true",
                        help="print the calls, jobs, their count and total steps; launch and "
                             "write nothing")
    parser.add_argument("--list", action="store_true",
                        help="every setting and protocol with its jobs and total steps")
    parser.add_argument("--forwards", action="store_true",
                        help="with --list: the image forwards of training and evaluation "
                             "(--eval_splits selection and all) and the estimated GPU-hours of "
                             "every setting and protocol, from the recorded full-size image "
                             "counts (or those under --data_dir)")
    parser.add_argument("--describe", action="store_true",
                        help="every value of the setting's protocol with its source, and the "
                             "differences the host cannot express")
    parser.add_argument("--datasets", nargs="+", default=None,
                        help="run only these of the setting's datasets")
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="run only these of the setting's algorithms")
    parser.add_argument("--hparams", default=None,
                        help="JSON object added to every run's hparams (e.g. a local "
                             "pretrained_path); printed jobs show the result")
    parser.add_argument("--epochs", type=float, default=None,
                        help="replace an epoch-based setting's training (or UDG fine-tuning) "
                             "epochs, e.g. 50 for DMG's paper budget")
    parser.add_argument("--pretrain_epochs", type=float, default=None,
                        help="replace a UDG setting's pretraining epochs")
    parser.add_argument("--steps", type=int, default=None,
                        help="replace a step-based setting's training steps (a short trial "
                             "run; the table's checkpoint frequency stays, the last step is "
                             "always recorded)")
    parser.add_argument("--test_envs", nargs="+", default=None, metavar="SET",
                        help="run only these of the setting's test-environment sets, each "
                             "comma-separated (e.g. 0, or 1,2,3 for the single-source job "
                             "trained on environment 0)")
    parser.add_argument("--clip_checkpoint", default=None, metavar="FILE",
                        help="IP/OOP settings: score with this local copy of the table's CLIP "
                             "weights (e.g. open_clip_pytorch_model.bin of "
                             "timm/vit_base_patch16_clip_224.laion400m_e32) instead of the "
                             "download cache")
    borrow(parser, "eval_splits", choices=EVAL_SPLITS, default="selection",
           help="selection (default): every job evaluates only the splits model selection reads "
           "(the same tables, less evaluation); all: every split at every record (full learning "
           "curves)")
    parser.add_argument("--dry_run_sweeps", action="store_true",
                        help="list plain sweep calls given after it: launch FLAGS [:: launch "
                             "FLAGS ...] (the DRY_RUN=1 mode of sweeps/*.sh)")
    return parser


def require_torch() -> None:
    """Raise :class:`UsageError` (:func:`dg_plugins.runtime.requirement_line`) when this
    interpreter cannot import torch (every listing and sweep needs it; ``--describe`` does not)."""
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as err:
        raise UsageError(runtime.requirement_line("torch", err)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        if "--dry_run_sweeps" in argv:
            i = argv.index("--dry_run_sweeps")
            if argv[:i]:
                parser.error("--dry_run_sweeps takes only sweep calls after it")
            require_torch()
            return dry_run_sweeps(argv[i + 1:])
        args, extra = parser.parse_known_args(argv)
        if args.forwards and not args.list:
            parser.error("--forwards goes with --list (a dry run prints the forwards anyway)")
        if args.list:
            require_torch()
            return (list_forwards if args.forwards else list_settings)(args.data_dir)
        if args.setting is None:
            parser.error("give a SETTING (one of: " + ", ".join(ps.SETTINGS) + ") or --list")
        try:
            setting = ps.get_setting(args.setting)
            protocol = ps.get_protocol(setting, args.protocol)
        except KeyError as err:
            parser.error(err.args[0])
        if args.describe:
            sys.stdout.write(ps.describe(setting, protocol))
            return 0
        if args.data_dir is None:
            parser.error("--data_dir is required (the folder holding the datasets)")
        require_torch()
        if any(not token.startswith("-") for token in extra[:1]):
            parser.error(f"unexpected argument {extra[0]!r}: extra arguments are sweep flags "
                         "such as --n_trials 1")
        check_extra(extra, protocol)
        hparams = None
        if args.hparams is not None:
            try:
                hparams = parse_overrides(args.hparams)
            except ValueError as err:
                parser.error(str(err))
        output_dir = os.path.join(args.output_dir or os.path.join("sweep_output", setting.name),
                                  protocol.name)
        test_envs = None if args.test_envs is None else parse_test_env_sets(args.test_envs)
        clip = None if args.clip_checkpoint is None else os.path.abspath(args.clip_checkpoint)
        plan = plan_setting(setting, protocol, data_dir=args.data_dir, output_dir=output_dir,
                            launcher=args.command_launcher, datasets=args.datasets,
                            algorithms=args.algorithms, epochs=args.epochs,
                            pretrain_epochs=args.pretrain_epochs, steps=args.steps,
                            test_envs=test_envs, clip_checkpoint=clip, hparams=hparams,
                            extra=extra, eval_splits=args.eval_splits)
        plan.argv = argv
        if hparams:
            plan.notes.append(f"--hparams {json.dumps(hparams, sort_keys=True)} added to every "
                              "run's hparams")
        return dry_run(plan, args.data_dir) if args.dry_run else run(plan, args.data_dir)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def run(plan: Plan, data_dir: str) -> int:
    """Run ``plan``: check its prerequisites (none missing, or nothing starts), record the
    command, score the images (IP/OOP), launch the jobs as one queue, print the tables."""
    from dg_plugins.collect import cli as collect_cli  # imports pandas

    setting, protocol = plan.setting, plan.protocol
    header = f"{setting.name}, protocol {protocol.name}: {protocol.summary}"
    print(f"== {header}", flush=True)
    for note in plan.notes:
        print(f"   note: {note}")
    if problems := prerequisites(plan, data_dir, [call_cost(call.argv, forwards=False)
                                                 for call in plan.calls]):
        report_prerequisites(plan, problems, dry=False)
        return 2
    if plan.root:  # what ran, beside the sweep folders (collect_results reads only job folders)
        os.makedirs(plan.root, exist_ok=True)
        atomic_write_bytes(os.path.join(plan.root, "reproduce.txt"), (
            f"$ {module_line('reproduce', plan.argv)}\n"
            + "".join(f"note: {note}\n" for note in plan.notes)
            + ps.describe(setting, protocol)).encode())
    for argv in plan.prepare:
        os.makedirs(os.path.dirname(argv[argv.index("--out") + 1]), exist_ok=True)
        print(f"-- score: {module_line('alignment_scores', argv)}", flush=True)
        code = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.alignment_scores",
                               *argv]).returncode  # the command printed above
        if code:
            return 128 - code if code < 0 else code  # killed by a signal: 128 + its number
    status = launch_queue(plan)
    if status >= 128 or status == 2:  # stopped by a signal, or nothing launched
        return status
    for argv in plan.collects:
        print(f"-- tables of {header}", flush=True)
        print(f"-- {module_line('collect_results', argv)}", flush=True)
        code = collect_cli.main(argv)
        status = status or code
    return status


def launch_queue(plan: Plan) -> int:
    """Launch every job of every sweep call of ``plan`` as one queue (one launcher call), each as
    its ``sweep launch`` call would (:func:`dg_plugins.sweep.plan.launch_queue`): the status."""
    def announce(i: int, argv) -> None:
        print(f"-- sweep {i}/{len(plan.calls)}: {plan.calls[i - 1].label}", flush=True)
        print(f"$ {module_line('sweep', argv)}", flush=True)

    launch_args, queue, command_lines = sweep_plan.queue_calls(
        [call.argv for call in plan.calls], announce)
    print(f"-- one queue: the {len(queue)} jobs of the {len(plan.calls)} sweep(s) above, handed "
          f"to the {launch_args.command_launcher} launcher at once", flush=True)
    # The continue lines name the command that continues every sweep (the paper script's, or
    # this reproduce command), not one sweep's `sweep launch --resume`; the other lines (claims,
    # delete_incomplete after failures) each job's own sweep command.
    code = sweep_plan.launch_queue(launch_args, queue, command_lines,
                                   module_line("reproduce", plan.argv))
    if code >= 128:  # stopped by a signal
        print("Stopped; rerun the same command to continue (finished jobs are skipped, "
              "interrupted ones resume).", flush=True)
    elif code == 2:  # refused (bad input or a failed check)
        print("The queue launched nothing (see above); fix that and rerun the same command.",
              flush=True)
    return code


def module_line(module: str, argv: list[str]) -> str:
    """The command line of ``python -m dg_plugins.scripts.<module> argv``, quoted."""
    return shlex.join([sys.executable, "-m", f"dg_plugins.scripts.{module}", *argv])


def dry_run(plan: Plan, data_dir: str) -> int:
    """Print what running ``plan`` would do and cost, then its missing prerequisites; launch
    and write nothing."""
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
    if problems := prerequisites(plan, data_dir, costs):
        report_prerequisites(plan, problems, dry=True)
    return 0


def list_calls(calls: list[tuple[list[str], str]], launch_only: bool = False) -> list[CallCost]:
    """Print each sweep call (argv, label) with its jobs and cost, then the totals."""
    costs, pretrainings = [], set()
    for i, (argv, label) in enumerate(calls, 1):
        if launch_only and argv[0] != "launch":  # --dry_run_sweeps lists launches only
            raise UsageError(f"--dry_run_sweeps: call {i} must start with 'launch', got "
                             f"{argv[0]!r}")
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
    pretrainings = {key: steps for c in costs for key, steps in c.pretrain_steps.items()}
    return sum(len(c.jobs) for c in costs), sum(sum(c.steps) for c in costs), pretrainings


def settings_costs(data_dir: str | None, forwards: bool):
    """``(setting, protocol, costs of its calls)`` of every setting and protocol (placeholder
    folders; image counts under ``data_dir`` when given)."""
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


def list_settings(data_dir: str | None) -> int:
    """One row per setting and protocol: script, paper table, jobs, total steps, paper rows."""
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
    """One row per setting and protocol: jobs, image forwards of training and evaluation (both
    ``--eval_splits``), GPU-hours; image counts under ``data_dir``, else the recorded ones."""
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
    calls = sweep_plan.split_calls(tokens)
    if not calls:
        raise UsageError("--dry_run_sweeps needs sweep calls: launch FLAGS [:: launch FLAGS ...]")
    list_calls([(argv, "") for argv in calls], launch_only=True)
    print("Dry run: nothing launched or written.")
    return 0
