"""Plots of the IP/OOP analysis, as the paper's Fig. 2 (Teterwak et al., ICLR 2025): per target
environment the score histogram and the accuracy per score bin. matplotlib (Agg) loads to draw."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dg_plugins.alignment.rule import SplitRule


def bin_edges(scores, width: float) -> np.ndarray:
    """Edges of bins of ``width`` covering ``scores`` (aligned on multiples of ``width``)."""
    if width <= 0:
        raise ValueError(f"bin width must be positive, got {width}")
    scores = np.asarray(scores, dtype=np.float64)
    lo = math.floor(scores.min() / width) * width
    hi = math.ceil(scores.max() / width) * width
    if hi <= scores.max():
        hi += width
    n = max(1, int(round((hi - lo) / width)))
    return lo + width * np.arange(n + 1)


def binned_accuracy(scores, correct, edges) -> pd.DataFrame:
    """Per bin ``[edges[k], edges[k+1])`` (the last bin closed): ``lo``, ``hi``, ``count`` and
    ``accuracy`` (mean of ``correct``; NaN for an empty bin)."""
    scores, edges = np.asarray(scores, dtype=np.float64), np.asarray(edges, dtype=np.float64)
    counts = np.histogram(scores, edges)[0]
    hits = np.histogram(scores, edges, weights=np.asarray(correct, dtype=np.float64))[0]
    accuracy = np.where(counts > 0, hits / np.maximum(counts, 1), np.nan)
    return pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": counts,
                         "accuracy": accuracy})


def join_predictions(scores: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Predictions with each image's score (matched on ``env`` and ``path``)."""
    merged = predictions.merge(scores[["env", "path", "score"]], on=["env", "path"], how="left")
    missing = merged["score"].isna()
    if missing.any():
        raise ValueError(f"{int(missing.sum())} predicted images have no score (e.g. "
                         f"{merged.loc[missing, 'path'].iloc[0]!r}); use the score file of the "
                         "same data")
    return merged


def plot_alignment(scores: pd.DataFrame, out: str, predictions: pd.DataFrame | None = None,
                   rule: SplitRule | None = None, envs=None, bin_width: float = 0.02,
                   title: str | None = None, env_names: dict | None = None) -> list[pd.DataFrame]:
    """Write the figure to ``out`` (PNG); returns the binned-accuracy tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    scored = scores[scores["score"].notna()]
    if scored.empty:
        raise ValueError("no scores to plot (imported split folders carry none)")
    if envs is None:
        envs = sorted(set(predictions["env"]) if predictions is not None else set(scored["env"]))
    merged = join_predictions(scored, predictions) if predictions is not None else None
    edges = bin_edges(scored[scored["env"].isin(envs)]["score"], bin_width)
    rows = 2 if merged is not None else 1
    fig, axes = plt.subplots(rows, len(envs), figsize=(3.4 * len(envs), 2.6 * rows + 0.6),
                             squeeze=False, sharex=True)
    tables = []
    for col, env in enumerate(envs):
        values = scored.loc[scored["env"] == env, "score"].to_numpy()
        name = (env_names or {}).get(env) or (
            scored.loc[scored["env"] == env, "env_name"].iloc[0]
            if "env_name" in scored.columns and (scored["env"] == env).any() else str(env))
        ax = axes[0][col]
        ax.hist(values, bins=edges, color="#4C72B0", edgecolor="white")
        ax.set_title(f"env {env}: {name} ({len(values)} images)", fontsize=9)
        ax.set_ylabel("images" if col == 0 else "")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if rule is not None:
            ax.axvline(rule.threshold, color="#C44E52", linestyle="-", linewidth=1.2,
                       label=f"IP >= {rule.threshold:g}")
            for cut in (rule.drop_below, rule.drop_above):
                if cut is not None:
                    ax.axvline(cut, color="0.4", linestyle="--", linewidth=1.0)
            if col == 0:
                ax.legend(fontsize=7, loc="upper left")
        if merged is not None:
            part = merged[merged["env"] == env]
            table = binned_accuracy(part["score"], part["correct"], edges)
            table.insert(0, "env", env)
            tables.append(table)
            ax2 = axes[1][col]
            centers = (table["lo"] + table["hi"]) / 2
            ax2.bar(centers, table["accuracy"].fillna(0) * 100, width=bin_width * 0.9,
                    color="#55A868")
            for x, acc, count in zip(centers, table["accuracy"], table["count"]):
                if count:
                    ax2.text(x, acc * 100 + 2, str(int(count)), ha="center", fontsize=6)
            ax2.set_ylim(0, 110)
            ax2.set_ylabel("accuracy (%), n per bar" if col == 0 else "")
            ax2.set_xlabel("AlignmentScore (cosine)")
            if rule is not None:
                ax2.axvline(rule.threshold, color="#C44E52", linewidth=1.2)
        else:
            ax.set_xlabel("AlignmentScore (cosine)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return tables
