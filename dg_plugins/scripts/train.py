"""``python -m dg_plugins.scripts.train``: one DomainBed-compatible training job (flags:
:mod:`dg_plugins.train.cli`). In its own process the cyclic garbage collector is off until the
first training step has run, then on with everything alive frozen."""

import sys

from dg_plugins import runtime
from dg_plugins.train.cli import build_parser, main  # noqa: F401  (the command's surface)


def collect_after_first_step(job, step: int) -> None:
    """Step hook: the collector back on (:func:`dg_plugins.runtime.resume_collector`)."""
    runtime.resume_collector()


def run_command(argv=None) -> int:
    """``main`` as the command runs it, with the collector off during start-up."""
    runtime.pause_collector()
    args = build_parser().parse_args(argv)  # --help and usage errors end here, before torch
    from dg_plugins.train import loop, run

    loop.add_step_hook(collect_after_first_step)
    return run.execute(args)[1]


if __name__ == "__main__":
    sys.exit(run_command())
