"""train's command line: the parser (every row of :data:`dg_plugins.job.flags.FLAGS`) and
:func:`main`, the command: parse, then run the job (:mod:`.run`, imported only then, so that this
module stays torch-free for the sweep that forks jobs)."""

from __future__ import annotations

from dg_plugins.job.flags import build_train_parser as build_parser


def main(argv=None) -> int:
    """``python -m dg_plugins.scripts.train``: parse, run the job, return its exit status."""
    args = build_parser().parse_args(argv)
    from dg_plugins.train import run

    return run.execute(args)[1]
