"""``python -m dg_plugins.scripts.plot_alignment --scores F --out P``: the AlignmentScore
histogram per environment and, with ``--predictions`` (``alignment_eval --predictions``), the
accuracy per score bin (the paper's Fig. 2), as a PNG; the rule's cuts drawn as lines."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from dg_plugins.alignment import read_scores, resolve_rule
from dg_plugins.alignment.plots import plot_alignment
from dg_plugins.alignment.score_command import add_preset_flag, resolve_preset_flag


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dg_plugins.scripts.plot_alignment",
                                description="AlignmentScore histograms and accuracy per score bin.")
    p.add_argument("--scores", required=True, help="score file (alignment_scores)")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--predictions", default=None, help="per-image predictions (alignment_eval)")
    p.add_argument("--envs", type=int, nargs="+", default=None)
    p.add_argument("--bin_width", type=float, default=0.02)
    p.add_argument("--threshold", type=float, default=None)
    p.add_argument("--drop_below", type=float, default=None)
    p.add_argument("--drop_above", type=float, default=None)
    add_preset_flag(p)
    p.add_argument("--split", choices=("all", "in", "out"), default="all")
    p.add_argument("--title", default=None)
    p.add_argument("--table", default=None, help="also write the binned accuracy here (CSV)")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = resolve_preset_flag(args, parser)
    try:
        table = read_scores(args.scores)
        rule = resolve_rule(args.threshold, preset, args.drop_below, args.drop_above)
        predictions = None
        if args.predictions:
            predictions = pd.read_csv(args.predictions, keep_default_na=False,
                                      dtype={"path": str, "env_name": str})
            if missing := {"env", "path", "correct"} - set(predictions.columns):
                raise ValueError(f"{args.predictions} lacks the columns {sorted(missing)}; write "
                                 "it with alignment_eval --predictions")
            if args.split != "all":
                predictions = predictions[predictions["split"] == args.split]
        tables = plot_alignment(table.frame, args.out, predictions, rule, args.envs,
                                args.bin_width, args.title)
        print(f"wrote {args.out}")
        if tables:
            binned = pd.concat(tables, ignore_index=True)
            print(binned.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
            if args.table:
                binned.to_csv(args.table, index=False)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
