"""Did each job learn? One row per job folder: its accuracy on the training environments'
validation splits (``env{i}_out_acc``) and on its test environments (``env{i}_in_acc``, the
accuracy DomainBed's tables report) at the first and at the last checkpoint, each the mean over
those environments, and a verdict against chance (``1 / classes``).

A job *learns* when its last source-validation accuracy is at least ``margin`` (default 0.05)
above both its first checkpoint's and chance. A short smoke run can show a method learning
without showing it beat ERM; this table is for the first, the result tables for the second.
``collect_results --learning_check`` prints it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.engine.records import acc_matrix

#: How far above its first checkpoint and above chance the last source accuracy must be.
MARGIN = 0.05


def learning_rows(records: pd.DataFrame, num_classes: dict[str, int],
                  margin: float = MARGIN) -> pd.DataFrame:
    """One row per job: algorithm, dataset, test envs, label fraction (UDG; "" otherwise), the
    first and last steps, source-validation and target accuracy at each, chance, and
    ``learns`` (bool). ``num_classes``: dataset -> number of classes (for chance); a dataset it
    lacks gets chance NaN, and then only the first-vs-last rule decides."""
    source = acc_matrix(records, "env{t}_out_acc")
    target = acc_matrix(records, "env{t}_in_acc")
    rows = []
    for job, index in records.groupby("job", sort=True).indices.items():
        steps = records["step"].to_numpy()[index]
        first, last = index[np.argmin(steps)], index[np.argmax(steps)]
        tests = [int(t) for t in records["args.test_envs"].iloc[first]]
        envs = np.arange(source.shape[1])
        train_envs = [i for i in envs if i not in tests and not np.isnan(source[first, i])]
        dataset = records["args.dataset"].iloc[first]
        classes = num_classes.get(dataset)
        chance = 1.0 / classes if classes else np.nan
        fraction = records["args.label_fraction"].iloc[first]

        def mean(matrix, row, columns):
            values = matrix[row, columns] if columns else np.array([np.nan])
            return float(np.nanmean(values)) if not np.isnan(values).all() else np.nan

        src_first, src_last = mean(source, first, train_envs), mean(source, last, train_envs)
        learns = bool(src_last >= src_first + margin
                      and (np.isnan(chance) or src_last >= chance + margin))
        rows.append({
            "job": job, "algorithm": records["args.algorithm"].iloc[first],
            "dataset": dataset, "test_envs": ",".join(map(str, tests)),
            "labels": "" if pd.isna(fraction) else f"{fraction:.0%}",
            "first_step": int(steps.min()), "last_step": int(steps.max()),
            "source_first": src_first, "source_last": src_last,
            "target_first": mean(target, first, tests), "target_last": mean(target, last, tests),
            "chance": chance, "learns": learns})
    return pd.DataFrame(rows)


def render(rows: pd.DataFrame) -> str:
    """The rows as an aligned text table (accuracies in percent), then a one-line summary."""
    if rows.empty:
        return "Learning check: no job\n"
    shown = rows.sort_values(["dataset", "algorithm", "labels", "test_envs"], kind="stable")

    def pct(value: float) -> str:
        return "-" if np.isnan(value) else f"{100 * value:.1f}"

    table = pd.DataFrame({
        "Algorithm": shown["algorithm"], "Dataset": shown["dataset"],
        "Test envs": shown["test_envs"], "Labels": shown["labels"],
        "Steps": [f"{a}->{b}" for a, b in zip(shown["first_step"], shown["last_step"])],
        "Source val acc": [f"{pct(a)} -> {pct(b)}" for a, b in
                           zip(shown["source_first"], shown["source_last"])],
        "Target acc": [f"{pct(a)} -> {pct(b)}" for a, b in
                       zip(shown["target_first"], shown["target_last"])],
        "Chance": [pct(c) for c in shown["chance"]],
        "Learns": ["yes" if flag else "NO" for flag in shown["learns"]],
        "Job": shown["job"]})
    if not shown["labels"].astype(bool).any():
        table = table.drop(columns="Labels")
    text = table.to_string(index=False)
    failing = int((~rows["learns"]).sum())
    summary = (f"{len(rows)} jobs; every job learns (last source-validation accuracy at least "
               f"{100 * MARGIN:.0f} points above its first checkpoint and above chance)"
               if not failing else
               f"{failing} of {len(rows)} jobs do not learn (last source-validation accuracy "
               f"less than {100 * MARGIN:.0f} points above its first checkpoint or chance)")
    return f"-------- Learning check: first -> last checkpoint, mean over environments\n{text}\n{summary}\n"
