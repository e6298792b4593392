"""Several sweep calls as one queue: their jobs enumerated as sweep does, then handed to the
launcher at once, so one launcher (and one fork server) runs them all. ``python -m
dg_plugins.sweep.plan [--name N] ... :: launch FLAGS [:: launch FLAGS ...]`` (the quick start,
``sweeps/offline_quickstart.sh``) also plans the run's time estimate over every job
(:data:`dg_plugins.sweep.progress.RUN`; docs/sweep.md); ``reproduce`` queues a setting's calls
the same way."""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import sys
from typing import Callable, Sequence
from unittest import mock

from dg_plugins import runtime
from dg_plugins.sweep import actions, progress
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep.jobs import summary_line

CALL_SEPARATOR = "::"


def split_calls(tokens) -> list[list[str]]:
    """Sweep calls given in a row, separated by :data:`CALL_SEPARATOR` (empty ones dropped)."""
    return [list(call) for separator, call in itertools.groupby(
        tokens, lambda token: token == CALL_SEPARATOR) if not separator]


def queue_calls(calls: Sequence[Sequence[str]],
                announce: Callable[[int, Sequence[str]], None] | None = None):
    """``(launch_args, jobs, command_lines)`` of ``calls`` (sweep argvs sharing their launch flags):
    each job once, hashed as its call hashes it, and each call's argv for the command lines shown.
    ``announce(i, argv)`` before each call (then its jobs' counts)."""
    launch_args, queue, command_lines = None, {}, {}
    for i, call in enumerate(calls, 1):
        if announce is not None:
            announce(i, call)
        args, jobs = sweep_cli.sweep_jobs(call)
        if args.command != "launch" or args.dry_run:
            raise ValueError(f"{'--dry_run' if args.dry_run else args.command}: a queue only "
                             "launches its sweep calls (to list their jobs: DRY_RUN=1 for the "
                             "scripts in sweeps/, or sweep launch --dry_run)")
        launch_args = launch_args or args
        if announce is not None:
            print(summary_line(jobs), flush=True)
        for job in jobs:
            queue.setdefault(job.output_dir, job)
            for folder in (job.output_dir, actions.sweep_dir_of(job.output_dir)):
                command_lines.setdefault(os.path.abspath(folder), list(call))
    return launch_args, list(queue.values()), command_lines


def launch_queue(launch_args, jobs, command_lines, rerun: str) -> int:
    """Launch ``jobs`` (:func:`queue_calls`) as one ``sweep launch`` (one launcher call); its lines
    on how to continue name ``rerun`` (or ``$DG_SWEEP_RERUN_COMMAND``). The exit status."""
    rerun = os.environ.get(actions.RERUN_ENV) or rerun
    with mock.patch.dict(os.environ, {actions.RERUN_ENV: rerun}):  # as it was after
        return sweep_cli.run_jobs(launch_args, jobs, command_lines)


def main(argv: list[str] | None = None) -> int:
    """Launch every job of the sweep calls as one queue, with a time estimate over all of them
    (printed before the first job, updated as jobs finish)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index(CALL_SEPARATOR) if CALL_SEPARATOR in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m dg_plugins.sweep.plan",
                                     description=main.__doc__)
    parser.add_argument("--name", default="")
    parser.add_argument("--reference_rate", type=float, default=None, metavar="SECONDS",
                        help="seconds per training step measured elsewhere (a fresh start's "
                        "rough estimate)")
    parser.add_argument("--reference_note", default="measured elsewhere",
                        help="how the reference rate was measured")
    args = parser.parse_args(argv[:cut])
    calls = split_calls(argv[cut:])
    if not calls:
        parser.error("give the sweep calls after '::': launch FLAGS [:: launch FLAGS ...]")
    with sweep_cli.usage_errors(sweep_cli.build_parser()):
        launch_args, jobs, command_lines = queue_calls(calls)
    reference = ([args.reference_rate, args.reference_note]
                 if args.reference_rate is not None else None)
    run = progress.Progress({job.output_dir: job.train_args.get("steps") for job in jobs},
                            reference, name=args.name)
    print(run.first_line(), flush=True)
    with runtime.swapped(progress, "RUN", run):
        return launch_queue(launch_args, jobs, command_lines, rerun=shlex.join(
            [sys.executable, "-m", "dg_plugins.sweep.plan", *argv]))


if __name__ == "__main__":
    runtime.pause_collector()  # until the launch (runtime.resume_collector), as sweep's
    sys.exit(main())
