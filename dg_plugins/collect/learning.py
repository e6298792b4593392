"""Did each job learn? (``collect_results --learning_check``): source-validation and target
accuracy at the first and last checkpoint against chance (docs/collect.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dg_plugins.collect.records import acc_matrix

MARGIN = 0.05  # how far above its first checkpoint and chance the last source accuracy must be


def learning_rows(records: pd.DataFrame, num_classes: dict[str, int],
                  margin: float = MARGIN, running: set[str] | frozenset = frozenset()
                  ) -> pd.DataFrame:
    """One row per job: steps, accuracies, chance, ``learns``, ``running``; ``attrs['margin']``."""
    source, target = (acc_matrix(records, f"env{{t}}_{split}_acc") for split in ("out", "in"))
    recorded = records.get("num_classes", pd.Series(np.nan, records.index)).to_numpy(dtype=float)
    rows = []
    for job, index in records.groupby("job", sort=True).indices.items():
        steps = records["step"].to_numpy()[index]
        first, last = index[np.argmin(steps)], index[np.argmax(steps)]
        tests = [int(t) for t in records["args.test_envs"].iloc[first]]
        train_envs = [i for i in range(source.shape[1])
                      if i not in tests and not np.isnan(source[first, i])]
        dataset = records["args.dataset"].iloc[first]
        own = recorded[index][~np.isnan(recorded[index])]
        recorded_here = bool(len(own) and own[-1] > 0)  # the job's latest record that says
        classes = float(own[-1]) if recorded_here else num_classes.get(dataset)
        chance_from = "record" if recorded_here else "catalogue" if classes else ""
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
    frame = pd.DataFrame(rows)
    frame.attrs["margin"] = margin
    return frame


def render(rows: pd.DataFrame) -> str:
    """The rows as an aligned text table, then a summary stating the margin."""
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
    points = f"{100 * rows.attrs.get('margin', MARGIN):.0f}"
    running = len(rows) - len(judged)
    note = f" ({running} still running, not judged)" if running else ""
    if failing:
        summary = (f"{failing} of {len(judged)} finished jobs do not learn{note} (last "
                   f"source-validation accuracy less than {points} points above its "
                   "first checkpoint or chance)")
    else:
        summary = (f"{len(judged)} finished job{'s' * (len(judged) != 1)}{note}; every one "
                   f"learns (last source-validation accuracy at least {points} points above "
                   "its first checkpoint and above chance)")
    fallback = int((rows["chance_from"] == "catalogue").sum())
    if fallback:
        summary += (f"\nchance of {fallback} job{'s' if fallback != 1 else ''} (marked *) is from "
                    "the dataset catalogue: their records have no num_classes (written before "
                    "it was recorded); check it matches the data they trained on")
    title = "-------- Learning check: first -> last checkpoint, mean over environments"
    return f"{title}\n{text}\n{summary}\n"
