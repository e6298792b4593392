"""``python -m dg_plugins.scripts.train``: one DomainBed-compatible training job. The flags are
:mod:`dg_plugins.train.cli`'s (``--help``); the job, and its exit statuses, are
:mod:`dg_plugins.train`'s.

In its own process (:func:`run_command`) Python's cyclic garbage collector is off until the job's
first training step has run (:func:`dg_plugins.runtime.pause_collector`; ``torch._dynamo`` comes
with the first optimizer), then on with everything alive frozen."""

import sys

from dg_plugins import runtime
from dg_plugins.train.cli import build_parser, main  # noqa: F401  (the command's surface)


def collect_after_first_step(job, step: int) -> None:
    """Step hook: the collector back on, everything alive now left out of its collections."""
    runtime.resume_collector()


def run_command(argv=None) -> int:
    """:func:`main` as the command runs it, with the collector off during start-up (above)."""
    runtime.pause_collector()
    args = build_parser().parse_args(argv)  # --help and usage errors end here, before torch
    from dg_plugins.train import job, run

    job.add_step_hook(collect_after_first_step)
    return run.execute(args)[1]


if __name__ == "__main__":
    sys.exit(run_command())
