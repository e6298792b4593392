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
                  margin: float = MARGIN, running: set[str] | frozenset = frozenset()
                  ) -> pd.DataFrame:
    """One row per job: algorithm, dataset, test envs, label fraction (UDG; "" otherwise), the
    first and last steps, source-validation and target accuracy at each, chance, ``learns``
    (bool) and ``running`` (the job is in ``running``: not done yet, so not judged).
    ``num_classes``: dataset -> number of classes (for chance); a dataset it lacks gets chance
    NaN, and then only the first-vs-last rule decides."""
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
            "chance": chance, "learns": learns, "running": job in running})
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
        "Learns": ["running" if run else "yes" if flag else "NO"
                   for flag, run in zip(shown["learns"], shown["running"])],
        "Job": shown["job"]})
    if not shown["labels"].astype(bool).any():
        table = table.drop(columns="Labels")
    text = table.to_string(index=False)
    judged = rows[~rows["running"]]
    failing = int((~judged["learns"]).sum())
    running = len(rows) - len(judged)
    note = f" ({running} still running, not judged)" if running else ""
    if failing:
        summary = (f"{failing} of {len(judged)} finished jobs do not learn{note} (last "
                   f"source-validation accuracy less than {100 * MARGIN:.0f} points above its "
                   "first checkpoint or chance)")
    else:
        plural = "s" if len(judged) != 1 else ""
        summary = (f"{len(judged)} finished job{plural}{note}; every one learns (last source-validation "
                   f"accuracy at least {100 * MARGIN:.0f} points above its first checkpoint and "
                   "above chance)")
    title = "-------- Learning check: first -> last checkpoint, mean over environments"
    return f"{title}\n{text}\n{summary}\n"
