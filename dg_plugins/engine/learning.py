"""Did each job learn? One row per job folder: its accuracy on the training environments'
validation splits (``env{i}_out_acc``) and on its test environments (``env{i}_in_acc``, the
accuracy DomainBed's tables report) at the first and at the last checkpoint, each the mean over
those environments, and a verdict against chance (``1 / classes``).

The class count is the job's own: its records' ``num_classes`` (the classes the job's data had,
e.g. 3 for a PACS folder holding 3 classes). Records written before that key existed fall back to
the dataset's catalogue count (:data:`dg_plugins.catalog.DATASET_CLASSES`: PACS 7), and the row
says so (``chance_from``), as does the summary line, since a catalogue count can be wrong for a
trimmed or custom copy of the data.

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
    first and last steps, source-validation and target accuracy at each, chance,
    ``chance_from`` ("record": the records' ``num_classes``; "catalogue": ``num_classes``, the
    fallback dataset -> class count for records without the key; "" when neither knows),
    ``learns`` (bool) and ``running`` (the job is in ``running``: not done yet, so not judged).
    Without any class count chance is NaN, and then only the first-vs-last rule decides."""
    source = acc_matrix(records, "env{t}_out_acc")
    target = acc_matrix(records, "env{t}_in_acc")
    recorded = (records["num_classes"].to_numpy(dtype=float) if "num_classes" in records.columns
                else np.full(len(records), np.nan))
    rows = []
    for job, index in records.groupby("job", sort=True).indices.items():
        steps = records["step"].to_numpy()[index]
        first, last = index[np.argmin(steps)], index[np.argmax(steps)]
        tests = [int(t) for t in records["args.test_envs"].iloc[first]]
        envs = np.arange(source.shape[1])
        train_envs = [i for i in envs if i not in tests and not np.isnan(source[first, i])]
        dataset = records["args.dataset"].iloc[first]
        own = recorded[index][~np.isnan(recorded[index])]
        if len(own) and own[-1] > 0:  # the job's latest record that says
            classes, chance_from = float(own[-1]), "record"
        else:
            classes = num_classes.get(dataset)
            chance_from = "catalogue" if classes else ""
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
            "chance": chance, "chance_from": chance_from, "learns": learns,
            "running": job in running})
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
        "Chance": [pct(c) + ("*" if source == "catalogue" else "")
                   for c, source in zip(shown["chance"], shown["chance_from"])],
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
    fallback = int((rows["chance_from"] == "catalogue").sum())
    if fallback:
        summary += (f"\nchance of {fallback} job{'s' if fallback != 1 else ''} (marked *) is from "
                    "the dataset catalogue: their records have no num_classes (written before "
                    "it was recorded); check it matches the data they trained on")
    title = "-------- Learning check: first -> last checkpoint, mean over environments"
    return f"{title}\n{text}\n{summary}\n"
