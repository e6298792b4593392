"""train's command line: the parser (:data:`dg_plugins.job.flags.FLAGS`) and :func:`main`, which
imports :mod:`.run` only after parsing, so that this module stays torch-free."""

from __future__ import annotations

from dg_plugins.job.flags import build_train_parser as build_parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from dg_plugins.train import run

    return run.execute(args)[1]
