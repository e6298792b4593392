"""Markdown table of the MPBM single-source study (sweeps/mpbm_rotatedmnist5k_study.sh): one row
per configuration folder and algorithm, the source's validation accuracy, each target's test
accuracy and the per-trial mean over targets, each as mean +- standard error over trials.

Selection as collect_results' single-source tables (dg_plugins.engine.single_source): ``iid``
keeps each run's earliest checkpoint with the best source validation accuracy
(``env{s}_out_acc``); ``oracle`` keeps the last checkpoint. Standard error as DomainBed prints it
(population std of the trial values / sqrt(trials)). Unlike collect_results' ``Avg`` column
(the mean of the per-target means), ``Avg`` here also gets its standard error, computed from each
trial's own mean over the targets.

    python sweeps/mpbm_study_table.py OUTPUT_DIR [main no_mix no_adv] [--selection iid]
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np

LABELS = {"main": "", "no_mix": " (mpbm_lambda_mix = 0)", "no_adv": " (mpbm_lambda_adv = 0)"}


def runs(folder: str):
    """``(algorithm, source, trial, records)`` per finished job of ``folder``."""
    for path in sorted(glob.glob(os.path.join(folder, "*", "results.jsonl"))):
        if not os.path.exists(os.path.join(os.path.dirname(path), "done")):
            continue
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        args = records[0]["args"]
        n_envs = sum(1 for k in records[0] if k.endswith("_in_acc") and k.startswith("env"))
        (source,) = set(range(n_envs)) - set(args["test_envs"])
        yield args["algorithm"], source, args["trial_seed"], records, n_envs, args["dataset"]


def pick(records, source, selection):
    if selection == "oracle":
        return records[-1]
    key = f"env{source}_out_acc"
    best = max(r[key] for r in records)
    return next(r for r in records if r[key] == best)


def mean_se(values):
    values = 100 * np.asarray(values, dtype=float)
    return f"{values.mean():.1f} ± {values.std() / np.sqrt(len(values)):.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir")
    p.add_argument("configs", nargs="*", default=["main", "no_mix", "no_adv"])
    p.add_argument("--selection", default="iid", choices=["iid", "oracle"])
    args = p.parse_args(argv)
    rows, header = [], None
    for config in args.configs:
        groups: dict = {}
        for algorithm, source, trial, records, n_envs, dataset in runs(os.path.join(args.output_dir,
                                                                          config)):
            chosen = pick(records, source, args.selection)
            targets = [e for e in range(n_envs) if e != source]
            values = [chosen[f"env{source}_out_acc"]] + [chosen[f"env{t}_in_acc"]
                                                        for t in targets]
            values.append(np.mean(values[1:]))
            groups.setdefault((algorithm, source), {})[trial] = values
            header = header or (source, targets, dataset)
        for (algorithm, source), trials in sorted(groups.items()):
            table = np.array([trials[t] for t in sorted(trials)])
            cells = [mean_se(table[:, i]) for i in range(table.shape[1])]
            rows.append(f"| {algorithm}{LABELS.get(config, ' (' + config + ')')} | "
                        f"{len(trials)} | " + " | ".join(cells) + " |")
    from dg_plugins import catalog

    source, targets, dataset = header
    names = catalog.DATASET_ENVIRONMENTS.get(dataset) or [str(e) for e in range(max(targets) + 1)]
    print(f"| Algorithm | trials | {names[source]} (source, val) | "
          + " | ".join(names[t] for t in targets) + " | Avg (targets) |")
    print("|:--|--:|" + "--:|" * (len(targets) + 2))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
