"""The report's figures (matplotlib, headless): Pareto front (drawn by :mod:`tuner.review.pareto`,
its names kept here), decision per stage, latency CDFs, parameter importances.

Each figure is drawn from a typed structure holding exactly the numbers it shows (built by
:mod:`tuner.review.report`, kept on the report so tests and readers can check the picture
against the stored decisions); :func:`png` turns a figure into PNG bytes (written as a file and
embedded in report.html).
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")  # no display: the report is written on servers and in CI

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from tuner.review.pareto import INFEASIBLE_GREY as INFEASIBLE_GREY
from tuner.review.pareto import UNCONFIRMED_GREY as UNCONFIRMED_GREY
from tuner.review.pareto import ParetoData as ParetoData
from tuner.review.pareto import ParetoPoint as ParetoPoint
from tuner.review.pareto import PointKind as PointKind
from tuner.review.pareto import pareto_figure
from tuner.study.decision.acceptance import Decision

ACCEPTED_GREEN = "#2e8b57"
NOISE_GREY = "#e4e4e4"
UNCONFIRMED = "search window, not confirmed"


# -- the numbers behind the figures ---------------------------------------------------------


@dataclass(frozen=True)
class StageColumn:
    """One stage of the improvement figure.

    ``decision`` is the stored acceptance decision on the selection objective (the means of
    the confirmation rounds); ``search_gain_pct`` is the stage winner's one search window per
    objective against the baseline's mean, in % with > 0 = better: never confirmed.
    """

    stage: str
    decision: Decision | None
    search_gain_pct: dict[str, float] = field(default_factory=dict)

    @property
    def confirmed(self) -> bool:
        return self.decision is not None and bool(self.decision.candidate_values)

    @property
    def accepted(self) -> bool:
        return self.decision is not None and self.decision.accepted

    @property
    def verdict(self) -> str:
        if self.decision is None:
            return "not decided"
        return "accepted" if self.accepted else "kept incumbent"

    @property
    def gain_pct(self) -> float | None:
        """The confirmed gain over the incumbent's mean, % (> 0 = better)."""
        return _relative(self.decision.gain if self.decision else None, self._reference)

    @property
    def noise_pct(self) -> float | None:
        """The gain the decision needed (its threshold), % of the incumbent's mean."""
        return _relative(self.decision.threshold if self.decision else None, self._reference)

    @property
    def improvement_pct(self) -> float:
        """What the figure shows as an improvement: an accepted decision's gain, else 0."""
        return (self.gain_pct or 0.0) if self.accepted else 0.0

    @property
    def _reference(self) -> float | None:
        return self.decision.incumbent_mean if self.decision else None


@dataclass(frozen=True)
class ImprovementData:
    objectives: list[str]
    stages: list[StageColumn]
    decided_by: str = ""  # the selection objective the decisions compare


@dataclass(frozen=True)
class CdfSeries:
    label: str
    e2e_s: list[float]
    ttft_s: list[float]


@dataclass(frozen=True)
class ImportanceData:
    target: str
    by_stage: dict[str, dict[str, float]]


@dataclass(frozen=True)
class FigureData:
    """The numbers behind each figure of the report, by figure name."""

    pareto: ParetoData
    improvement: ImprovementData
    latency_cdf: list[CdfSeries]
    importances: ImportanceData


def _relative(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or not math.isfinite(value * reference):
        return None
    return 100.0 * value / abs(reference) if reference else None


# -- drawing ---------------------------------------------------------------------------------


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def render(data: FigureData) -> dict[str, bytes]:
    """Every figure of ``data`` as PNG bytes, by name."""
    return {
        "pareto": png(pareto_figure(data.pareto)),
        "improvement": png(improvement_figure(data.improvement)),
        "latency_cdf": png(cdf_figure(data.latency_cdf)),
        "importances": png(importance_figure(data.importances)),
    }


def _empty(fig: Figure, ax: plt.Axes, text: str) -> Figure:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def improvement_figure(data: ImprovementData) -> Figure:
    """Left: each stage's decision (confirmation rounds' means, noise band, accepted solid).
    Right: each stage winner's search window against the baseline's mean, hollow: unconfirmed."""
    width = max(11.0, 2.0 + 3.0 * len(data.stages))  # room for each stage's means under it
    fig, (left, right) = plt.subplots(1, 2, figsize=(width, 4.6))
    if not data.stages:
        _empty(fig, right, "no stage has run")
        return _empty(fig, left, "no stage has run")
    x = np.arange(len(data.stages))
    _decisions(left, data, x)
    _search_windows(right, data, x)
    left.set_xticks(x, [f"{c.stage} ({c.verdict})\n{_decision_text(c)}" for c in data.stages])
    right.set_xticks(x, [f"{c.stage}\n({c.verdict})" for c in data.stages])
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlim(-0.6, len(data.stages) - 0.4)
        ax.axhline(0, color="black", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylabel("change (%, > 0 = better)")
        ax.legend(fontsize=7, loc="best")
    return fig


def _once(seen: set[str], label: str) -> str:
    """Each kind of mark once in the legend (matplotlib leaves out labels starting with _)."""
    if label in seen:
        return f"_{label}"
    seen.add(label)
    return label


def _decision_mark(ax: plt.Axes, xi: float, col: StageColumn, seen: set[str]) -> None:
    """The confirmed gain: a solid bar when accepted, a hollow grey circle when kept."""
    gain = col.gain_pct
    if gain is None:
        return
    if col.accepted:
        ax.bar(xi, gain, 0.35, color=ACCEPTED_GREEN, label=_once(seen, "accepted: confirmed gain"))
    else:
        label = _once(seen, "kept: confirmed gain within the noise")
        ax.plot(xi, gain, "o", mfc="none", mec=UNCONFIRMED_GREY, ms=9, label=label)


def _decision_text(col: StageColumn) -> str:
    """The decision's numbers, under its stage: the rounds' means and the gain it needed."""
    d = col.decision
    if d is None or not col.confirmed:
        return "nothing confirmed" if d is not None else ""
    means = f"{d.incumbent_mean:.4g} -> {d.candidate_mean:.4g}"
    why = "" if col.accepted else "\n" + textwrap.fill(d.reason, 28)  # noise, or an SLO missed
    return f"{means}\nneeded gain > {d.threshold:.4g}{why}"


def _decisions(ax: plt.Axes, data: ImprovementData, x: np.ndarray) -> None:
    seen: set[str] = set()
    for xi, col in zip(x, data.stages, strict=True):
        noise = col.noise_pct
        if noise is not None:
            label = _once(seen, "noise band: the gain needed")
            ax.bar(xi, 2 * noise, 0.6, bottom=-noise, color=NOISE_GREY, label=label)
        _decision_mark(ax, xi, col, seen)
        mark = f"{col.improvement_pct:+.1f}%" if col.accepted else "no change"
        ax.annotate(
            mark,
            (xi, 0),
            ha="center",
            va="top",
            xytext=(0, -4),
            textcoords="offset points",
            fontsize=8,
            color="#333",
        )
    what = data.decided_by or "the selection objective"
    ax.set_title(f"Decision on {what}\n(means of the confirmation rounds)", fontsize=10)


MARKERS = ("o", "s", "^", "D", "v")


def _search_windows(ax: plt.Axes, data: ImprovementData, x: np.ndarray) -> None:
    width = 0.7 / max(len(data.objectives), 1)
    for i, name in enumerate(data.objectives):
        gains = [c.search_gain_pct.get(name, math.nan) for c in data.stages]
        offset = (i - (len(data.objectives) - 1) / 2) * width
        marker = MARKERS[i % len(MARKERS)]
        ax.plot(
            x + offset,
            gains,
            marker,
            mfc="none",
            mec=UNCONFIRMED_GREY,
            ms=8,
            ls="none",
            label=f"{name}: {UNCONFIRMED}",
        )
    ax.set_title(
        "Each stage winner's search window\nvs the baseline mean (not confirmed)", fontsize=10
    )


def cdf_figure(series: list[CdfSeries]) -> Figure:
    """Empirical CDFs of E2E latency and TTFT, one line per configuration."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    if not series:
        return _empty(fig, axes[0], "no request records found (trial folders not here)")
    for ax, col, title in zip(
        axes, ("e2e_s", "ttft_s"), ("end-to-end latency", "TTFT"), strict=True
    ):
        for s in series:
            values = np.sort(np.asarray(getattr(s, col), dtype=float))
            if len(values):
                ax.step(
                    values,
                    np.arange(1, len(values) + 1) / len(values),
                    where="post",
                    label=f"{s.label} (n={len(values)})",
                )
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.set_xlabel(f"{title} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"CDF of {title}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def importance_figure(data: ImportanceData) -> Figure:
    """Horizontal bars of each stage's parameter importances for the target."""
    rows = [(f"{stage}: {p}", v) for stage, imp in data.by_stage.items() for p, v in imp.items()]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 + 0.4 * max(len(rows), 3)))
    if not rows:
        return _empty(fig, ax, "fewer than 3 measured trials per stage: no ranking")
    names, values = zip(*rows, strict=True)
    ax.barh(range(len(rows)), values, color="steelblue")
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlabel(f"importance for {data.target} (PED-ANOVA, normalised per stage)")
    ax.set_title("Parameter importances")
    ax.grid(axis="x", alpha=0.3)
    return fig
