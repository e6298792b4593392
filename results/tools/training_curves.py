"""Per-checkpoint curves of a sweep (results/digits_offline.md): for each algorithm and step, the
mean over its jobs of the source-validation accuracy (``env{s}_out_acc`` averaged over the job's
training environments), of the held-out accuracy (``env{t}_in_acc`` averaged over its test
environments) and of the update keys named with ``--keys`` (e.g. DMG's ``iou_hard``), with the
smallest and largest job value in brackets. It shows whether a budget has levelled off (the
source accuracy stops rising) and how a method's mechanism evolves.

Records are read from every ``SWEEP_DIR/*/results.jsonl`` (whole records: the update keys too),
finished or not (a running job adds its checkpoints so far).

    python results/tools/training_curves.py SWEEP_DIR [--keys iou_hard overlap] [--every 100]
"""

from __future__ import annotations

import argparse
import glob
import os
from collections import defaultdict

import numpy as np

from dg_plugins.job.records import read_record_lines
from dg_plugins.collect.records import parse_line


def read_sweep(sweep_dir: str) -> list[dict]:
    """Every complete record line of the sweep's job folders (a running job's torn last line is
    left out)."""
    return [parse_line(line)
            for path in sorted(glob.glob(os.path.join(sweep_dir, "*", "results.jsonl")))
            for line in read_record_lines(path) if line.endswith(b"\n")]


def cell(values, scale=100.0, digits=1) -> str:
    """``mean [min, max]`` of ``values`` x ``scale``; empty without values."""
    if not values:
        return ""
    v = scale * np.asarray(values, dtype=float)
    return f"{v.mean():.{digits}f} [{v.min():.{digits}f}, {v.max():.{digits}f}]"


def curves(records, keys=(), every: int = 1) -> list[str]:
    """Markdown rows: algorithm, step, jobs, source val, held out, then each key."""
    groups = defaultdict(list)
    for record in records:
        if record["step"] % every == 0:
            groups[(record["args"]["algorithm"], record["step"])].append(record)
    rows = []
    for (algorithm, step), group in sorted(groups.items()):
        src, tgt, extra = [], [], {k: [] for k in keys}
        for record in group:
            args = record["args"]
            n_envs = sum(1 for k in record if k.endswith("_out_acc") and k.startswith("env"))
            sources = [e for e in range(n_envs) if e not in args["test_envs"]]
            src.append(np.mean([record[f"env{e}_out_acc"] for e in sources]))
            tgt.append(np.mean([record[f"env{e}_in_acc"] for e in args["test_envs"]]))
            for k in keys:
                if record.get(k) is not None:
                    extra[k].append(record[k])
        rows.append(f"| {algorithm} | {int(step)} | {len(src)} | {cell(src)} | {cell(tgt)} | "
                    + " | ".join(cell(extra[k], 1.0, 2) for k in keys) + " |")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--keys", nargs="*", default=[])
    p.add_argument("--every", type=int, default=1, help="only steps that are multiples of this")
    args = p.parse_args(argv)
    records = read_sweep(args.sweep_dir)
    print("| algorithm | step | jobs | source val (mean [min, max]) | held out | "
          + " | ".join(args.keys) + " |")
    print("|:--|--:|--:|--:|--:|" + "--:|" * len(args.keys))
    print("\n".join(curves(records, args.keys, args.every)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
