"""Markdown table of MPBM's diagnostics (dg_plugins/algorithms/mpbm.py, the ``diag_*`` record keys)
per configuration folder and checkpoint of a study (sweeps/mpbm_digits_offline_study.sh): for each
step, the mean over the folder's MPBM jobs of each diagnostic, with the smallest and largest job
value in brackets when the jobs differ. A record holds the mean, over the steps since the
previous record, of the latest probe's values (the probe runs every ``mpbm_diag_every`` steps).

Columns: the phase of the record's steps (its name when they lie in one phase, else the mean
phase index), the query-to-source correlation, the shares of query and source pixel values on the
clamp bounds, the model's accuracy on the queries (%), the attention concentration (share of
feature dimensions whose top instance is the most common one), the synthetic-to-nearest-real
cosine, the share of synthetic coordinates outside the real features' hull, the discriminator's
accuracy on the probe's real and synthetic features, and the training's own L_mix^tr (``mix``,
0 in steps without it).

Records are read from every ``FOLDER/*/results.jsonl`` (whole records), finished or not.

    python results/tools/mpbm_diagnostics.py OUTPUT_DIR [online phased ...] [--steps 0 500 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training_curves import read_sweep  # noqa: E402  (results/tools/training_curves.py)

#: The phase names of MPBM's ``phase`` value (``dg_plugins.algorithms.mpbm.PHASES``; repeated
#: here so that the tool needs no torch).
PHASES = ("erm", "corr", "query", "gen", "synth", "finetune", "online")
COLUMNS = [("diag_query_corr", "query corr", 1.0, 2),
           ("diag_query_clamped", "query clamped", 1.0, 2),
           ("diag_source_clamped", "source clamped", 1.0, 2),
           ("diag_query_acc", "query acc (%)", 100.0, 1),
           ("diag_attn_top_share", "attn top share", 1.0, 2),
           ("diag_synth_cos", "synth cos", 1.0, 3),
           ("diag_synth_outside_hull", "outside hull", 1.0, 3),
           ("diag_disc_acc", "D acc", 1.0, 2), ("mix", "L_mix", 1.0, 2)]


def cell(values, scale: float, digits: int) -> str:
    """``mean`` or ``mean [min, max]`` of ``values`` x ``scale`` (empty without values)."""
    if not values:
        return ""
    v = scale * np.asarray(values, dtype=float)
    text = f"{v.mean():.{digits}f}"
    low, high = f"{v.min():.{digits}f}", f"{v.max():.{digits}f}"
    return text if low == high else f"{text} [{low}, {high}]"


def phase_name(values) -> str:
    """The phase's name when every job's record lies in one phase, else the mean index."""
    values = np.asarray(values, dtype=float)
    if np.all(values == values[0]) and float(values[0]).is_integer():
        return PHASES[int(values[0])]
    return f"{values.mean():.2f}"


def rows(folder: str, label: str, steps=None) -> list[str]:
    groups = defaultdict(list)
    for record in read_sweep(folder):
        if record["args"]["algorithm"] == "MPBM" and (steps is None or record["step"] in steps):
            groups[record["step"]].append(record)
    out = []
    for step, group in sorted(groups.items()):
        cells = [cell([r[key] for r in group if key in r], scale, digits)
                 for key, _, scale, digits in COLUMNS]
        out.append(f"| {label} | {step} | {len(group)} | {phase_name([r['phase'] for r in group])}"
                   f" | " + " | ".join(cells) + " |")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir")
    p.add_argument("configs", nargs="*", default=["online", "phased", "phased_value",
                                                  "phased_noise", "phased_no_mix",
                                                  "online_no_mix"])
    p.add_argument("--steps", type=int, nargs="*", help="only these record steps")
    args = p.parse_args(argv)
    lines = []
    for config in args.configs:
        lines += rows(os.path.join(args.output_dir, config), config,
                      set(args.steps) if args.steps else None)
    print("| config | step | jobs | phase | " + " | ".join(c[1] for c in COLUMNS) + " |")
    print("|:--|--:|--:|:--|" + "--:|" * len(COLUMNS))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
