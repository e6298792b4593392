"""The plan of a run of several sweeps, for its time estimate: ``python -m dg_plugins.sweep.plan
FILE ... :: launch FLAGS [:: launch FLAGS ...]`` writes their jobs' folders and steps to FILE
(docs/sweep.md). Used by ``sweeps/offline_quickstart.sh``."""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep.progress import Progress

#: Separates the sweep calls.
CALL_SEPARATOR = "::"


def split_calls(tokens) -> list[list[str]]:
    """Sweep calls given in a row, separated by :data:`CALL_SEPARATOR` (empty ones dropped)."""
    return [list(call) for separator, call in itertools.groupby(
        tokens, lambda token: token == CALL_SEPARATOR) if not separator]


def main(argv: list[str] | None = None) -> int:
    """Write the plan of the sweep calls to FILE (every job's folder and steps) and print the
    first estimate."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index(CALL_SEPARATOR) if CALL_SEPARATOR in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m dg_plugins.sweep.plan",
                                     description=main.__doc__)
    parser.add_argument("file")
    parser.add_argument("--name", default="")
    parser.add_argument("--reference_rate", type=float, default=None, metavar="SECONDS",
                        help="seconds per training step measured elsewhere (a fresh start's "
                        "rough estimate)")
    parser.add_argument("--reference_note", default="measured elsewhere",
                        help="how the reference rate was measured")
    args = parser.parse_args(argv[:cut])
    planned: dict[str, int | None] = {}
    calls = split_calls(argv[cut:])
    for call in calls:
        for job in sweep_cli.sweep_jobs(call, dry_run=True)[1]:
            planned[job.output_dir] = job.train_args.get("steps")
    reference = ([args.reference_rate, args.reference_note]
                 if args.reference_rate is not None else None)
    progress = Progress(planned, {}, reference, name=args.name, path=args.file)
    os.makedirs(os.path.dirname(os.path.abspath(args.file)), exist_ok=True)
    progress.save()
    print(progress.first_line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
