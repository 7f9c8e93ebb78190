"""The report's figures (matplotlib, headless): Pareto front, gain per stage, latency CDFs,
parameter importances. Each function takes plain tables and returns a Figure; :func:`png`
turns one into PNG bytes (written as a file and embedded in report.html).
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: the report is written on servers and in CI

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

INFEASIBLE_GREY = "#b0b0b0"
X_COL, Y_COL = "m_output_throughput_tok_s", "m_e2e_p99_s"


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _empty(fig: Figure, ax: plt.Axes, text: str) -> Figure:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


FEASIBLE_STYLE: dict[str, Any] = {
    "cmap": "viridis",
    "s": 55,
    "edgecolors": "black",
    "linewidths": 0.4,
}
FRONT_STYLE: dict[str, Any] = {
    "color": "crimson",
    "lw": 1.2,
    "ls": "--",
    "marker": "o",
    "mfc": "none",
    "ms": 11,
}


def _points(fig: Figure, ax: plt.Axes, data: pd.DataFrame, cost_col: str | None) -> None:
    bad, good = data[~data["feasible"]], data[data["feasible"]]
    ax.scatter(bad[X_COL], bad[Y_COL], c=INFEASIBLE_GREY, s=40, label="infeasible (SLO missed)")
    colour = good[cost_col] if cost_col and cost_col in good else None
    points = ax.scatter(good[X_COL], good[Y_COL], c=colour, label="feasible", **FEASIBLE_STYLE)
    if colour is not None and len(good):
        fig.colorbar(points, ax=ax, label=cost_col)
    front = good[good["pareto"]].sort_values(X_COL)
    ax.plot(front[X_COL], front[Y_COL], label="Pareto front", **FRONT_STYLE)
    for _, row in data.iterrows():
        ax.annotate(
            row["label"],
            (row[X_COL], row[Y_COL]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )


def pareto_figure(trials: pd.DataFrame, cost_col: str | None) -> Figure:
    """P99 E2E latency vs output throughput; colour = cost, infeasible grey, front outlined."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    # Confirmation re-runs repeat configs already shown: baseline and search trials only.
    shown = trials["role"].isin(["baseline", "search"]) & trials["measured"]
    data = trials[shown & trials[X_COL].notna() & trials[Y_COL].notna()]
    if data.empty:
        return _empty(fig, ax, "no measured trial")
    _points(fig, ax, data, cost_col)
    ax.margins(0.12)
    ax.set_xlabel("output throughput (tokens/s) \u2192 better")
    ax.set_ylabel("P99 end-to-end latency (s) \u2193 better")
    ax.set_title("Trials: latency vs throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def improvement_figure(
    stages: pd.DataFrame, objectives: list[str], directions: list[str]
) -> Figure:
    """Per stage, how much better each objective got (best feasible trial vs the baseline)."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    cols = [
        (o, d) for o, d in zip(objectives, directions, strict=True) if f"{o}_change_pct" in stages
    ]
    if stages.empty or not cols:
        return _empty(fig, ax, "no stage has a feasible trial")
    x = np.arange(len(stages))
    width = 0.8 / len(cols)
    for i, (name, direction) in enumerate(cols):
        sign = 1.0 if direction == "maximize" else -1.0  # > 0 always means better
        gain = sign * stages[f"{name}_change_pct"].astype(float).fillna(0.0)
        ax.bar(x + i * width, gain, width, label=name)
    labels = [
        f"{s}\n({'accepted' if a else 'kept incumbent'})"
        for s, a in zip(stages["stage"], stages["accepted"], strict=True)
    ]
    ax.set_xticks(x + width * (len(cols) - 1) / 2, labels)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("improvement vs baseline (%, > 0 = better)")
    ax.set_title("Best feasible trial of each stage against the baseline")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def cdf_figure(samples: dict[str, pd.DataFrame]) -> Figure:
    """Empirical CDFs of E2E latency and TTFT, one line per trial (baseline vs best)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    if not samples:
        return _empty(fig, axes[0], "no request records found (trial folders not here)")
    for ax, col, title in zip(
        axes, ("e2e_s", "ttft_s"), ("end-to-end latency", "TTFT"), strict=True
    ):
        for label, frame in samples.items():
            values = np.sort(frame[col].dropna().to_numpy(dtype=float))
            if len(values):
                ax.step(
                    values,
                    np.arange(1, len(values) + 1) / len(values),
                    where="post",
                    label=f"{label} (n={len(values)})",
                )
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.set_xlabel(f"{title} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"CDF of {title}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def importance_figure(importances: dict[str, dict[str, float]], target: str) -> Figure:
    """Horizontal bars of each stage's parameter importances for ``target``."""
    rows = [(f"{stage}: {p}", v) for stage, imp in importances.items() for p, v in imp.items()]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 + 0.4 * max(len(rows), 3)))
    if not rows:
        return _empty(fig, ax, "fewer than 3 measured trials per stage: no ranking")
    names, values = zip(*rows, strict=True)
    ax.barh(range(len(rows)), values, color="steelblue")
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlabel(f"importance for {target} (PED-ANOVA, normalised per stage)")
    ax.set_title("Parameter importances")
    ax.grid(axis="x", alpha=0.3)
    return fig
