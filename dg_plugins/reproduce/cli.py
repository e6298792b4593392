"""``python -m dg_plugins.scripts.reproduce``: the flags, and the flow from a setting to its dry run
or its run (scores, sweeps, tables). What it does: docs/reproduce.md."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys

from dg_plugins import runtime
from dg_plugins.files import atomic_write_bytes
from dg_plugins.hparams import parse_overrides
from dg_plugins.job import borrow
from dg_plugins.reference import paper_settings as ps
from dg_plugins.reproduce.plan import Plan, check_extra, parse_test_env_sets, plan_setting
from dg_plugins.reproduce.costs import plan_costs
from dg_plugins.reproduce.prerequisites import prerequisites, report_prerequisites
from dg_plugins.reproduce.report import dry_run, dry_run_sweeps, list_settings, module_line
from dg_plugins.sweep import actions, checks
from dg_plugins.sweep import costs as estimate
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep import jobs as sweep_lib
from dg_plugins.sweep.costs import EVAL_SPLITS, UsageError


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
                             "every setting and protocol, "
                             "from the recorded full-size image counts (or those under "
                             "--data_dir)")
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
    if "--dry_run_sweeps" in argv:
        i = argv.index("--dry_run_sweeps")
        if argv[:i]:
            parser.error("--dry_run_sweeps takes only sweep calls after it")
        try:
            require_torch()
            return dry_run_sweeps(argv[i + 1:])
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    args, extra = parser.parse_known_args(argv)
    try:
        if args.forwards and not args.list:
            parser.error("--forwards goes with --list (a dry run prints the forwards anyway)")
        if args.list:
            require_torch()
            return list_settings(args.data_dir, args.forwards)
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
    command, score the images (IP/OOP), launch every sweep call's jobs as one queue
    (:func:`launch_queue`), print the tables."""
    from dg_plugins.collect import cli as collect_cli  # imports pandas

    setting, protocol = plan.setting, plan.protocol
    header = f"{setting.name}, protocol {protocol.name}: {protocol.summary}"
    print(f"== {header}", flush=True)
    for note in plan.notes:
        print(f"   note: {note}")
    problems = prerequisites(plan, data_dir, plan_costs(plan))
    if problems:
        report_prerequisites(plan, problems, dry=False)
        return 2
    if plan.root:  # what ran, beside the sweep folders (collect_results reads only job folders)
        os.makedirs(plan.root, exist_ok=True)
        atomic_write_bytes(os.path.join(plan.root, "reproduce.txt"), (
            f"$ {shlex.join([sys.executable, '-m', 'dg_plugins.scripts.reproduce', *plan.argv])}\n"
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
    """Launch every job of every sweep call of ``plan`` as one queue: a single launcher call
    (``multi_gpu`` fills every GPU with them), each job in its own sweep folder with the folder,
    hash and command its ``sweep launch`` call gives it; the sweep's checks, claims (per sweep
    folder), ``--resume`` and reports as in one ``sweep launch``. Returns its exit status."""
    queue, seen, launch_args, command_lines = [], set(), None, {}
    for i, call in enumerate(plan.calls, 1):
        print(f"-- sweep {i}/{len(plan.calls)}: {call.label}", flush=True)
        print(f"$ {module_line('sweep', call.argv)}", flush=True)
        args, jobs = sweep_cli.sweep_jobs(call.argv)
        launch_args = launch_args or args  # the calls share their launch flags (plan's tail)
        print(sweep_lib.summary_line(jobs), flush=True)
        for job in jobs:
            if job.output_dir not in seen:
                seen.add(job.output_dir)
                queue.append(job)
                command_lines.setdefault(actions.sweep_dir_of(job.output_dir), call.argv)
    print(f"-- one queue: the {len(queue)} jobs of the {len(plan.calls)} sweep(s) above, handed "
          f"to the {launch_args.command_launcher} launcher at once", flush=True)
    # The continue lines name the command that continues every sweep (the paper script's, or
    # this reproduce command), not one sweep's `sweep launch --resume`; the other lines (claims,
    # delete_incomplete after failures) each sweep folder's own command.
    rerun = os.environ.get(actions.RERUN_ENV) or shlex.join(
        [sys.executable, "-m", "dg_plugins.scripts.reproduce", *plan.argv])
    with _environ(actions.RERUN_ENV, rerun):
        code = actions.run_action(
            "launch", queue, launcher_fn=sweep_cli.make_launcher(launch_args),
            seed=launch_args.seed, resume=launch_args.resume, command_line=command_lines,
            skip_confirmation=launch_args.skip_confirmation, check=checks.launch_problems,
            estimate=lambda selected: estimate.print_estimate(selected,
                                                              launch_args.command_launcher))
    if code >= 128:  # stopped by a signal
        print("Stopped; rerun the same command to continue (finished jobs are skipped, "
              "interrupted ones resume).", flush=True)
    elif code == 2:  # refused (bad input or a failed check)
        print("The queue launched nothing (see above); fix that and rerun the same command.",
              flush=True)
    return code


@contextlib.contextmanager
def _environ(name: str, value: str):
    """``$name`` set to ``value`` inside the block, then as it was."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
