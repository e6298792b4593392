"""Markdown table of a single-source study with one sweep folder per configuration
(sweeps/mpbm_rotatedmnist5k_study.sh, sweeps/digits_offline_single_source.sh,
sweeps/mpbm_digits_offline_study.sh): one row per configuration folder and algorithm, the
source's validation accuracy, each target's test accuracy and the per-trial mean over targets,
each as mean +- standard error over trials.

Records are loaded and selected exactly as collect_results' single-source tables do it
(``dg_plugins.collect.records.load_records``,
``dg_plugins.collect.single_source.select_single_source``). Standard error as DomainBed prints
it (population std of the trial values / sqrt(trials)). Unlike collect_results' ``Avg`` column
(the mean of the per-target means), ``Avg`` here also gets its standard error, computed from each
trial's own mean over the targets.

``--step N`` tabulates instead the record of step N of every run (no selection: e.g. each run's
last checkpoint), read from the job folders' ``results.jsonl``. ``--plot PNG`` also draws the
table as collect_results --plot draws one (``dg_plugins.collect.plots.accuracy_figure``: a bar
per configuration and column at the cell's mean, its standard error as error bar), so that the
configurations of a study, which live in separate sweep folders, share one figure.

    python results/tools/mpbm_study_table.py OUTPUT_DIR [main no_mix no_adv] [--selection iid]
    python results/tools/mpbm_study_table.py OUTPUT_DIR [configs ...] --step 1000
    python results/tools/mpbm_study_table.py OUTPUT_DIR [configs ...] --plot study_iid.png
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pandas as pd

from dg_plugins import catalog
from dg_plugins.collect.records import load_records
from dg_plugins.collect.selection import IID, ORACLE
from dg_plugins.collect.single_source import SINGLE_SOURCE_KEY, select_single_source
from dg_plugins.collect.tables import Cell, Section, Table

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training_curves import read_sweep  # noqa: E402  (results/tools/training_curves.py)

LABELS = {"main": "", "no_mix": " (mpbm_lambda_mix = 0)", "no_adv": " (mpbm_lambda_adv = 0)",
          # sweeps/mpbm_digits_offline_study.sh
          "erm": "", "color_jitter": " (colour jitter 0.8)", "online": " (online)",
          "phased": " (phased)", "phased_value": " (phased, value projection)",
          "phased_noise": " (phased, SGLD noise scaled)",
          "phased_no_mix": " (phased, mpbm_lambda_mix = 0)",
          "online_no_mix": " (online, mpbm_lambda_mix = 0)"}


def records_at_step(folder: str, step: int) -> pd.DataFrame:
    """Rows shaped like :func:`select_single_source`'s (``algorithm``, ``source``, ``n_envs``,
    ``trial_seed``, ``dataset``, ``acc{i}``: the source's out-split and the targets' in-split
    accuracy) from every run's record of ``step``."""
    rows = []
    for record in read_sweep(folder):
        if record["step"] != step:
            continue
        args = record["args"]
        n_envs = sum(1 for k in record if k.startswith("env") and k.endswith("_out_acc"))
        (source,) = [e for e in range(n_envs) if e not in args["test_envs"]]
        row = {"algorithm": args["algorithm"], "source": source, "n_envs": n_envs,
               "trial_seed": args["trial_seed"], "dataset": args["dataset"]}
        row.update({f"acc{e}": record[f"env{e}_{'out' if e == source else 'in'}_acc"]
                    for e in range(n_envs)})
        rows.append(row)
    return pd.DataFrame(rows)


def study_table(output_dir: str, configs: list[str], method=IID, step: int | None = None
                ) -> Table:
    """The study as a :class:`Table`: a row per configuration folder and algorithm, its cells
    (:meth:`Cell.of`, mean and standard error over trials) the source's validation accuracy, each
    target's accuracy and the per-trial mean over the targets (``Avg (targets)``)."""
    rows, header = {}, None
    for config in configs:
        folder = os.path.join(output_dir, config)
        if step is not None:
            chosen = records_at_step(folder, step)
        else:  # collect_results' single-source choice
            chosen = select_single_source(load_records(folder, progress=False), method)
        if chosen.empty:
            raise SystemExit(f"error: {folder} has no finished run to tabulate: run its sweep "
                             f"first, or leave '{config}' out")
        for (algorithm, source), group in chosen.groupby(["algorithm", "source"], sort=True):
            n_envs = int(group["n_envs"].iloc[0])
            targets = [e for e in range(n_envs) if e != source]
            table = group.sort_values("trial_seed")[[f"acc{e}" for e in [source] + targets]]
            table = table.to_numpy()
            table = np.column_stack([table, table[:, 1:].mean(axis=1)])  # per-trial target mean
            rows[f"{algorithm}{LABELS.get(config, ' (' + config + ')')}"] = [
                Cell.of(table[:, i]) for i in range(table.shape[1])]
            header = header or (source, targets, group["dataset"].iloc[0])
    source, targets, dataset = header
    names = catalog.DATASET_ENVIRONMENTS.get(dataset) or [str(e) for e in range(max(targets) + 1)]
    labels = [f"{names[source]} (source, val)", *(names[t] for t in targets), "Avg (targets)"]
    chosen_by = f"the record of step {step}" if step is not None else method.name
    return Table(title=f"{dataset}, source {names[source]}",
                 header=f"{dataset}, source {names[source]}: {chosen_by}; a row per configuration "
                        f"folder; mean ± standard error over trials",
                 col_labels=labels, rows=rows, colwidth=0, dataset=dataset, source=names[source])


def markdown(table: Table) -> str:
    lines = ["| Algorithm | trials | " + " | ".join(table.col_labels) + " |",
             "|:--|--:|" + "--:|" * len(table.col_labels)]
    for row, cells in table.rows.items():
        lines.append(f"| {row} | {cells[0].n} | "
                     + " | ".join(cell.text("±") for cell in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir")
    p.add_argument("configs", nargs="*", default=["main", "no_mix", "no_adv"])
    p.add_argument("--selection", default="iid", choices=["iid", "oracle"])
    p.add_argument("--step", type=int, help="each run's record of this step, no selection")
    p.add_argument("--plot", metavar="PNG", help="also draw the table as a bar chart")
    args = p.parse_args(argv)
    method = IID if args.selection == "iid" else ORACLE
    table = study_table(args.output_dir, args.configs, method, args.step)
    print(markdown(table))
    if args.plot:
        from dg_plugins.collect import plots

        figure = plots.accuracy_figure(Section(method, SINGLE_SOURCE_KEY, "", [table]), table)
        plots.save_png(figure, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
