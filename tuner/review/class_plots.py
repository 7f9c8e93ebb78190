"""The report's per-request-class latency CDFs (``class_latency_cdf``): for each class of a mixed
workload, the baseline against the chosen configuration on that class's own requests, of the
metric its SLO bounds, with the limit drawn where the class has one.

The all-requests CDF (:func:`tuner.review.plots.cdf_figure`) pools every class: a chat class
whose first tokens got slower can hide under a document class that got faster. The numbers
behind this figure are :class:`ClassCdf`, one per class, kept on the report's
:class:`ReportFigureData` beside the other figures' numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from tuner.review import plots

# what an SLO of one class bounds (tuner.config.objectives.CLASS_SLO_METRICS), as drawn
METRIC_TITLES = {"e2e": "end-to-end latency", "ttft": "TTFT", "tpot": "TPOT"}
DEFAULT_METRICS = ("e2e", "ttft")  # a class without an SLO of its own: as the all-requests figure
SLO_RED = "#c0392b"
P99 = 0.99


@dataclass(frozen=True)
class ClassSeries:
    """One side (the baseline, or the chosen configuration) on one class's requests only."""

    label: str  # the side, as the all-requests CDF names it
    values: dict[str, list[float]]  # metric (e2e, ttft, tpot) -> seconds, one per request

    def n(self, metric: str) -> int:
        return len(self.values.get(metric, []))


@dataclass(frozen=True)
class ClassCdf:
    """One request class: the metrics drawn (those its SLOs bound, else E2E and TTFT), its
    limits on them, and one series per side that recorded a request of the class."""

    name: str
    metrics: list[str]
    limits: dict[str, float] = field(default_factory=dict)  # metric -> the class's P99 SLO, s
    series: list[ClassSeries] = field(default_factory=list)


@dataclass(frozen=True)
class ReportFigureData(plots.FigureData):
    """Every figure's numbers: those of :mod:`tuner.review.plots`, and the per-class CDFs
    (empty where the workload has one class and no class SLO: no figure then)."""

    class_latency_cdf: list[ClassCdf] = field(default_factory=list)


def render(data: ReportFigureData) -> dict[str, bytes]:
    """Every figure of ``data`` as PNG bytes, by name; the per-class CDFs only where there are
    classes to show."""
    drawn = plots.render(data)
    if data.class_latency_cdf:
        drawn["class_latency_cdf"] = plots.png(class_cdf_figure(data.class_latency_cdf))
    return drawn


def class_cdf_figure(classes: list[ClassCdf]) -> Figure:
    """One row of subplots per class, one subplot per metric it shows: each side's empirical
    CDF (n= in its label), the class's SLO limit as a vertical line, the P99 level dotted."""
    cols = max((len(c.metrics) for c in classes), default=1) or 1
    rows = max(len(classes), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 4.4 * rows), squeeze=False)
    if not classes:
        _note(axes[0][0], "no request class to show")
        return fig
    # the same colour for a side in every subplot, in the all-requests figure's order
    sides = list(dict.fromkeys(s.label for c in classes for s in c.series))
    colours = {label: f"C{i}" for i, label in enumerate(sides)}
    for row, cdf in zip(axes, classes, strict=True):
        for col, ax in enumerate(row):
            if col < len(cdf.metrics):
                _panel(ax, cdf, cdf.metrics[col], colours)
            else:
                ax.set_visible(False)
    fig.tight_layout()
    return fig


def _panel(ax: plt.Axes, cdf: ClassCdf, metric: str, colours: dict[str, str]) -> None:
    title = METRIC_TITLES.get(metric, metric)
    drawn = False
    for s in cdf.series:
        values = np.sort(np.asarray(s.values.get(metric, []), dtype=float))
        if len(values):
            ax.step(
                values,
                np.arange(1, len(values) + 1) / len(values),
                where="post",
                color=colours[s.label],
                label=f"{s.label} (n={len(values)})",
            )
            drawn = True
    if not drawn:
        _note(ax, f"no {title} recorded for class {cdf.name}")
    limit = cdf.limits.get(metric)
    if limit is not None:
        ax.axvline(limit, color=SLO_RED, lw=2.0, ls="--", label=f"SLO: P99 {title} <= {limit:g} s")
    ax.axhline(P99, color="grey", lw=0.8, ls=":", label="P99")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{title} (s)")
    ax.set_ylabel("fraction of the class's requests")
    ax.set_title(f"class {cdf.name}: CDF of {title}", fontsize=10)
    ax.grid(alpha=0.3)
    # under the subplot: the lines fill the plot's corners, and a side's n differs by class
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)


def _note(ax: plt.Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
