"""The report's Pareto figure: the study's own objectives on its axes, its labels never on top of
each other.

A CPU study of the default objectives draws P99 E2E latency against output tokens/s; a GPU
preset (``conf/objectives/gpu_fleet.yaml``) draws tokens/s per GPU against tokens/s per user.
The axes come from the stored study (:func:`axes_for`), each labelled with its objective's name,
unit and which way is better; a third objective, where the study has one, is the colour.

Only the points a reader looks for are labelled (the hand-over, the baseline's mean, then the
front), each placed where its text meets no other label, no marker and no legend
(:func:`_place_labels`, measured on the drawn figure); a label that finds no free place is left
out, its point stays a marker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: the report is written on servers and in CI

import matplotlib.pyplot as plt
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from tuner.errors import ConfigError
from tuner.scoring.objective import get_objective

INFEASIBLE_GREY = "#b0b0b0"
UNCONFIRMED_GREY = "#6f6f6f"
LEADER_GREY = "#8a8a8a"
BASELINE_LABEL = "baseline (mean)"
CPU_X, CPU_Y = "output_throughput", "p99_e2e_latency"  # the CPU default's pair, by name


# -- the numbers behind the figure ---------------------------------------------------------


class PointKind(StrEnum):
    """What a point of the Pareto figure is."""

    BASELINE_MEAN = "baseline mean"
    BASELINE_WINDOW = "baseline window"
    SEARCH = "search window"


@dataclass(frozen=True)
class Axis:
    """One objective of the study as the figure shows it."""

    name: str
    direction: str  # minimize | maximize, as the stored study optimises it
    unit: str = ""

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def label(self, horizontal: bool) -> str:
        """The name, the unit, and which way is better on this axis."""
        arrow = ("\u2192" if self.maximize else "\u2190") if horizontal else None
        arrow = arrow or ("\u2191" if self.maximize else "\u2193")
        unit = f" ({self.unit})" if self.unit else ""
        return f"{self.name}{unit} {arrow} better"

    @property
    def words(self) -> str:
        return f"{self.name} ({'higher' if self.maximize else 'lower'} is better)"


@dataclass(frozen=True)
class ParetoPoint:
    label: str
    kind: PointKind
    values: dict[str, float]  # the point's value of each study objective it has, by name
    feasible: bool
    pareto: bool = False  # on the study's front (the trials table's ``pareto`` column)
    handover: bool = False  # the configuration the report hands over

    def value(self, name: str | None) -> float:
        """The point's value of objective ``name``; NaN where it has none."""
        found = self.values.get(name or "")
        return float("nan") if found is None else found

    @property
    def throughput(self) -> float:
        """Output tokens/s where the study optimises it (the CPU default), else NaN."""
        return self.value(CPU_X)

    @property
    def p99(self) -> float:
        """P99 end-to-end latency, s, where the study optimises it, else NaN."""
        return self.value(CPU_Y)

    @property
    def text(self) -> str:
        return f"{self.label}: hand-over" if self.handover else self.label


@dataclass(frozen=True)
class ParetoData:
    """Search windows (one each) against the baseline's mean; its windows show its spread.
    ``y`` against ``x`` (None: the study has fewer objectives), ``colour`` a third one."""

    points: list[ParetoPoint]
    x: Axis | None = None
    y: Axis | None = None
    colour: Axis | None = None

    def of(self, kind: PointKind) -> list[ParetoPoint]:
        return [p for p in self.points if p.kind == kind]

    @property
    def caption(self) -> str | None:
        """What the figure plots, in words (None where it plots no pair of objectives)."""
        if self.x is None or self.y is None:
            return None
        colour = f"colour = {self.colour.name}, " if self.colour else ""
        return (
            f"Pareto front: {self.y.words} against {self.x.words} of the search windows (one "
            f"each, not confirmed) against the baseline's mean ({colour}grey = infeasible; "
            "labelled: the hand-over, the baseline and the front)"
        )


def axes_for(
    names: Sequence[str], directions: Sequence[str], select_by: str
) -> tuple[Axis | None, Axis | None, Axis | None]:
    """(x, y, colour) of a study optimising ``names``. The first objective goes up the y axis
    and the second across, so a study reads "first against second" as the issue names it (P99
    E2E against output tokens/s; tokens/s per GPU against tokens/s per user) and the CPU
    default keeps today's picture. Where ``select_by`` is neither of the two it takes the x axis
    instead: the objective each stage's winner was picked by is always read off an axis. The
    first objective left over is the colour. One objective: (None, it, None)."""
    axes = [_axis(n, d) for n, d in zip(names, directions, strict=True)]
    if len(axes) < 2:
        return None, (axes[0] if axes else None), None
    order = [0, 1] if select_by not in names[2:] else [0, list(names).index(select_by)]
    rest = [a for i, a in enumerate(axes) if i not in order]
    return axes[order[1]], axes[order[0]], (rest[0] if rest else None)


def _axis(name: str, direction: str) -> Axis:
    """The stored direction decides; the registry adds the unit (none for an objective whose
    plugin is not installed where the report is written)."""
    try:
        unit = str(get_objective(name).unit)
    except ConfigError:
        unit = ""
    return Axis(name, direction, unit)


# -- drawing ---------------------------------------------------------------------------------

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
LABEL_SIZE = 7
MAX_LABELS = 12  # more than this many names on one figure cannot be read anyway
# Where a label may sit, in points from its point: the nearest ring first, the four diagonals
# (where a label hides the least of the front's line) before the four sides.
SIDES = ((1, 1), (-1, 1), (1, -1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))
RINGS = (6.0, 14.0, 24.0, 36.0, 50.0, 66.0)
LEADER_FROM = 14.0  # a label this far out or further gets a thin line to its point
PAD_PX = 1.5  # labels keep this much clear space around them
MARKER_PT = {PointKind.BASELINE_MEAN: 8.0}  # half the width a marker covers, points
MARKER_DEFAULT_PT = 5.5  # the front's hollow ring, the widest of the other markers


def _empty(fig: Figure, ax: plt.Axes, text: str) -> Figure:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def _xy(points: list[ParetoPoint], data: ParetoData) -> tuple[list[float], list[float]]:
    x, y = (data.x.name if data.x else None), (data.y.name if data.y else None)
    return [p.value(x) for p in points], [p.value(y) for p in points]


def _search_points(fig: Figure, ax: plt.Axes, data: ParetoData) -> None:
    search = data.of(PointKind.SEARCH)
    bad, good = [p for p in search if not p.feasible], [p for p in search if p.feasible]
    ax.scatter(*_xy(bad, data), c=INFEASIBLE_GREY, s=40, label="infeasible (SLO missed)")
    shades = [p.value(data.colour.name) for p in good] if data.colour else []
    colour = shades if good and shades and all(math.isfinite(c) for c in shades) else None
    label = "search window (one each, not confirmed)"
    # a colour map only where there is a colour to map (matplotlib warns otherwise)
    style = FEASIBLE_STYLE if colour is not None else {**FEASIBLE_STYLE, "cmap": None}
    points = ax.scatter(*_xy(good, data), c=colour, label=label, **style)
    if colour is not None and data.colour is not None:
        unit = f" ({data.colour.unit})" if data.colour.unit else ""
        fig.colorbar(points, ax=ax, label=f"{data.colour.name}{unit}")


def _baseline_points(ax: plt.Axes, data: ParetoData) -> None:
    windows, mean = data.of(PointKind.BASELINE_WINDOW), data.of(PointKind.BASELINE_MEAN)
    style: dict[str, Any] = {"marker": "x", "c": UNCONFIRMED_GREY, "s": 30}
    ax.scatter(*_xy(windows, data), label="baseline windows", **style)
    label = f"baseline: mean of {len(windows)} window(s)"
    ax.scatter(*_xy(mean, data), marker="*", c="black", s=220, zorder=3, label=label)


def labelled(data: ParetoData) -> list[ParetoPoint]:
    """The points that get a name, most wanted first: the hand-over, the baseline's mean, then
    the front along x. Every other point is a marker only."""
    x = data.x.name if data.x else None
    front = sorted((p for p in data.points if p.pareto), key=lambda p: p.value(x))
    first = [p for p in data.points if p.handover]
    first += [p for p in data.of(PointKind.BASELINE_MEAN) if not p.handover]
    return [*first, *(p for p in front if p not in first)]


def pareto_figure(data: ParetoData) -> Figure:
    """The study's first objective against its second (:func:`axes_for`); colour = a third,
    infeasible grey, front outlined, the hand-over, baseline and front named."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    if data.x is None or data.y is None:
        one = f"one objective ({data.y.name}): no trade-off to draw" if data.y else None
        return _empty(fig, ax, one or "no measured trial")
    if not data.points:
        return _empty(fig, ax, "no measured trial")
    _search_points(fig, ax, data)
    _baseline_points(ax, data)
    # the study's front over all its objectives (a third is the colour): the table's column
    across = data.x.name
    front = sorted((p for p in data.points if p.pareto), key=lambda p: p.value(across))
    ax.plot(*_xy(front, data), label="Pareto front", **FRONT_STYLE)
    ax.margins(0.12)
    ax.set_xlabel(data.x.label(horizontal=True))
    ax.set_ylabel(data.y.label(horizontal=False))
    ax.set_title(f"{data.y.name} against {data.x.name}: search windows vs the baseline's mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _place_labels(fig, ax, data)
    return fig


# -- the labels ------------------------------------------------------------------------------


@dataclass
class _Layout:
    """What a new label must keep clear of, in display pixels."""

    frame: Bbox  # the axes: a label stays inside
    labels: list[Bbox] = field(default_factory=list)
    markers: list[Bbox] = field(default_factory=list)
    fixed: list[Bbox] = field(default_factory=list)  # the legend


def _place_labels(fig: Figure, ax: plt.Axes, data: ParetoData) -> None:
    """Name the points of :func:`labelled`, each at the nearest offset whose text box meets no
    label placed before it (nor, where one is free, a marker); a name with no free offset inside
    the axes is left out. Measured on the drawn figure: text sizes are the renderer's."""
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)  # matplotlib.use("Agg") above
    canvas.draw()  # the final layout: limits, colour bar, the legend's "best" place
    renderer = canvas.get_renderer()
    # Freeze what the labels were measured against: limits (a leader line must not rescale
    # them) and the legend's place ("best" would move it again on the next draw).
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    layout = _Layout(ax.get_window_extent(renderer))
    legend = ax.get_legend()
    if legend is not None:
        box = legend.get_window_extent(renderer)
        corner = ax.transAxes.inverted().transform((box.x0, box.y0))
        fixed = ax.legend(fontsize=8, loc=(float(corner[0]), float(corner[1])))
        layout.fixed.append(_padded(fixed.get_window_extent(renderer)))
    layout.markers = [_marker_box(ax, fig, p, data) for p in data.points]
    for point in labelled(data)[:MAX_LABELS]:
        _place(fig, ax, renderer, point, data, layout)


def _padded(box: Bbox, pad: float = PAD_PX) -> Bbox:
    return Bbox.from_extents(box.x0 - pad, box.y0 - pad, box.x1 + pad, box.y1 + pad)


def _meets(a: Bbox, b: Bbox) -> bool:
    """Whether two boxes share any area (touching edges do not count)."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _inside(box: Bbox, frame: Bbox) -> bool:
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def _marker_box(ax: plt.Axes, fig: Figure, p: ParetoPoint, data: ParetoData) -> Bbox:
    x, y = _xy([p], data)
    cx, cy = ax.transData.transform((x[0], y[0]))
    half = MARKER_PT.get(p.kind, MARKER_DEFAULT_PT) * fig.dpi / 72.0
    return Bbox.from_extents(cx - half, cy - half, cx + half, cy + half)


def _offsets() -> list[tuple[float, float]]:
    return [(dx * r, dy * r) for r in RINGS for dx, dy in SIDES]


def _place(
    fig: Figure,
    ax: plt.Axes,
    renderer: RendererBase,
    p: ParetoPoint,
    data: ParetoData,
    layout: _Layout,
) -> None:
    x, y = _xy([p], data)
    if not (math.isfinite(x[0]) and math.isfinite(y[0])):
        return
    text = ax.annotate(
        p.text, (x[0], y[0]), xytext=(0, 0), textcoords="offset points", fontsize=LABEL_SIZE
    )
    # First somewhere clear of every marker too; in a crowd, clear of the other labels only.
    for avoid_markers in (True, False):
        for dx, dy in _offsets():
            box = _try(text, renderer, dx, dy)
            if not _inside(box, layout.frame):
                continue
            blockers = layout.labels + layout.fixed + (layout.markers if avoid_markers else [])
            if any(_meets(box, other) for other in blockers):
                continue
            layout.labels.append(box)
            if max(abs(dx), abs(dy)) >= LEADER_FROM:
                _leader(fig, ax, (x[0], y[0]), (dx, dy))
            return
    text.remove()  # no free place: the point stays a marker


def _try(text: Annotation, renderer: RendererBase, dx: float, dy: float) -> Bbox:
    """Move ``text`` to ``(dx, dy)`` points from its point, on the side the offset points to,
    and return its padded box."""
    text.set_horizontalalignment("left" if dx > 0 else "right" if dx < 0 else "center")
    text.set_verticalalignment("bottom" if dy > 0 else "top" if dy < 0 else "center")
    text.xyann = (dx, dy)
    return _padded(text.get_window_extent(renderer))


def _leader(
    fig: Figure, ax: plt.Axes, xy: tuple[float, float], offset: tuple[float, float]
) -> None:
    """A thin line from a point to its label's near corner (a plain line, not the annotation's
    arrow, so that a label's box stays its text)."""
    start = ax.transData.transform(xy)
    scale = fig.dpi / 72.0
    end = (start[0] + offset[0] * scale, start[1] + offset[1] * scale)
    x1, y1 = ax.transData.inverted().transform(end)
    line: dict[str, Any] = {"color": LEADER_GREY, "lw": 0.5, "zorder": 1}
    ax.plot([xy[0], x1], [xy[1], y1], scalex=False, scaley=False, **line)
