"""`tuner report`: tables (pandas) and figures from the storage, as a terminal summary,
``report.html`` (figures embedded), PNGs, and every trial as CSV and Parquet.

Every comparison with the baseline uses its mean over all its measured windows: one window of a
shared machine can sit 20-40 % off, and a search window set against it shows gains the
acceptance decision rightly refused. Per stage the report keeps apart the winner's one search
window (never confirmed) and the stored decision (the confirmation rounds' means, the gain
they needed, the verdict).

The tables come from :mod:`tuner.review.report_tables`; this module assembles them into a
:class:`Report` and gathers the numbers behind each figure, drawn from
:class:`~tuner.review.class_plots.ReportFigureData` (the figures of :mod:`tuner.review.plots`
and the per-class latency CDFs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tuner.config.objectives import CLASS_SLO_METRICS
from tuner.review import class_plots, plots
from tuner.review.class_plots import ClassCdf, ClassSeries, ReportFigureData
from tuner.review.classes import class_names, class_slos, classes_frame, shows_classes
from tuner.review.estimates import EstimateCheck, estimate_check
from tuner.review.pareto import BASELINE_LABEL, axes_for
from tuner.review.plots import CdfSeries, ImprovementData, ParetoData, PointKind
from tuner.review.report_tables import (
    SearchWindow,
    StageOutcome,
    baseline_feasible,
    baseline_frame,
    failures_frame,
    importances,
    source_label,
    stage_outcomes,
    stages_frame,
    trials_frame,
)
from tuner.review.slos import HandoverSlos, handover_slos
from tuner.review.stored import Review, TrialView
from tuner.schema import Role, TrialAttr

# in the page's order; class_latency_cdf only where the workload has classes to show
FIGURES = ("pareto", "improvement", "latency_cdf", "class_latency_cdf", "importances")


# -- the report ------------------------------------------------------------------------------


@dataclass
class Report:
    """The tables and figures of one study, ready to print or write; ``data`` holds the
    numbers behind each figure (None when the report was built without figures)."""

    review: Review
    trials: pd.DataFrame
    baseline: pd.DataFrame
    outcomes: list[StageOutcome]
    stages: pd.DataFrame
    failures: pd.DataFrame
    importances: dict[str, dict[str, float]]
    estimates: EstimateCheck | None = None  # with study.prescreen: the plan against the trials
    # what the hand-over claims of each SLO, and how sure its windows are
    slos: HandoverSlos = field(default_factory=HandoverSlos)
    # per request class, the baseline against the hand-over (empty for a one-class workload)
    classes: pd.DataFrame = field(default_factory=pd.DataFrame)
    data: ReportFigureData | None = None
    figures: dict[str, bytes] = field(default_factory=dict)


def build_report(review: Review, figures: bool = True) -> Report:
    trials = trials_frame(review)
    outcomes = stage_outcomes(review)
    stages = stages_frame(outcomes, review.objectives)
    imps = importances(review)
    failures = failures_frame(trials)
    report = Report(
        review,
        trials,
        baseline_frame(review),
        outcomes,
        stages,
        failures,
        imps,
        estimate_check(review),
        handover_slos(review, review.choice().params),
        classes_frame(review, review.choice().params),
    )
    if figures:
        report.data = figure_data(report)
        drawn = class_plots.render(report.data)
        # FIGURES' order; a figure not named there (yet) after them, never left out
        report.figures = {**{name: drawn[name] for name in FIGURES if name in drawn}, **drawn}
    return report


def figure_data(report: Report) -> ReportFigureData:
    review = report.review
    sides = request_sides(review)  # each window's requests read once, for both CDF figures
    return ReportFigureData(
        pareto=pareto_data(review, report.trials),
        improvement=improvement_data(review, report.outcomes),
        latency_cdf=cdf_data(review, sides),
        importances=plots.ImportanceData(review.select_by, report.importances),
        class_latency_cdf=class_cdf_data(review, sides),
    )


def _values(row: pd.Series, names: list[str]) -> dict[str, float]:
    """A trials-table row's value of each study objective it has (its own columns)."""
    return {n: float(row[n]) for n in names if n in row and pd.notna(row[n])}


def _search_point(
    row: pd.Series, kind: PointKind, names: list[str], handover: str
) -> plots.ParetoPoint:
    return plots.ParetoPoint(
        row["label"],
        kind,
        _values(row, names),
        bool(row["feasible"]),
        # a baseline window only shows the spread: the front goes through the baseline's mean
        bool(row["pareto"]) and kind == PointKind.SEARCH,
        kind == PointKind.SEARCH and row["label"] == handover,
    )


def handover_label(review: Review) -> str:
    """The point of the hand-over: the accepted candidate's search window (the window its
    numbers come from), else the baseline's mean."""
    choice = review.choice()
    if choice.decision and choice.trial is not None:
        return source_label(choice.trial)
    return BASELINE_LABEL


def pareto_data(review: Review, trials: pd.DataFrame) -> ParetoData:
    """Search windows and baseline windows as measured, the baseline's mean as one point, on
    the study's own objectives: the stored study's, in its value order (config.yaml may be
    missing), arranged by :func:`tuner.review.pareto.axes_for`."""
    names = review.objectives
    x, y, colour = axes_for(names, review.directions, review.select_by)
    if x is None or y is None or trials.empty or not {x.name, y.name} <= set(trials.columns):
        return ParetoData([], x, y, colour)
    shown = trials[trials["measured"] & trials[x.name].notna() & trials[y.name].notna()]
    kinds = {Role.SEARCH: PointKind.SEARCH, Role.BASELINE: PointKind.BASELINE_WINDOW}
    rows = [r for _, r in shown.iterrows() if r["role"] in kinds]
    handover = handover_label(review)
    points = [_search_point(r, kinds[r["role"]], names, handover) for r in rows]
    base = shown[shown["stage"] == Role.BASELINE]
    if not base.empty:
        points.append(_baseline_point(review, base, handover == BASELINE_LABEL))
    return ParetoData(points, x, y, colour)


def _baseline_point(review: Review, base: pd.DataFrame, handover: bool) -> plots.ParetoPoint:
    """The mean of every baseline window, per objective (as every comparison uses it)."""
    means = {n: review.baseline_mean(n) for n in review.objectives}
    return plots.ParetoPoint(
        BASELINE_LABEL,
        PointKind.BASELINE_MEAN,
        {n: m for n, m in means.items() if m is not None},
        baseline_feasible(review),
        bool(base["pareto"].any()),
        handover,
    )


def _better_pct(review: Review, window: SearchWindow | None) -> dict[str, float]:
    """A search window's change against the baseline's mean, signed so that > 0 is better."""
    if window is None:
        return {}
    pairs = zip(review.objectives, review.directions, strict=True)
    signs = {n: 1.0 if d == "maximize" else -1.0 for n, d in pairs}
    return {n: signs[n] * pct for n, pct in window.vs_baseline_pct.items() if pct is not None}


def improvement_data(review: Review, outcomes: list[StageOutcome]) -> ImprovementData:
    columns = [
        plots.StageColumn(o.stage, o.decision, _better_pct(review, o.winner)) for o in outcomes
    ]
    decided = next((o.decision.objective for o in outcomes if o.decision), review.select_by)
    return ImprovementData(review.objectives, columns, decided)


def _requests(view: TrialView) -> pd.DataFrame | None:
    """The measured window's successful requests of ``view`` (its requests.jsonl)."""
    path = view.folder / "requests.jsonl" if view.folder else None
    if path is None or not path.is_file():
        return None
    frame = pd.read_json(path, lines=True)
    if not {"phase", "ok", "e2e_s", "ttft_s"} <= set(frame.columns):
        return None
    return frame[(frame["phase"] == "measure") & frame["ok"]]


def _confirm_windows(review: Review, stage: str, side: str) -> list[TrialView]:
    """A stage's confirmation rounds of one side (``candidate`` or ``incumbent``)."""
    views = review.confirm_trials()
    tags = [(v, str(v.attrs.get(TrialAttr.CONFIRM_TAG, "")).split("/")) for v in views]
    return [v for v, tag in tags if len(tag) == 3 and tag[0] == stage and tag[2] == side]


def cdf_sides(review: Review) -> list[tuple[str, list[TrialView]]]:
    """The two sides both latency CDF figures compare, each with its label: the baseline over
    all its windows against the chosen configuration over its search window and confirmation
    rounds; with no stage accepted, the best search window, marked."""
    windows = review.baseline_windows
    sides = [(f"baseline, all {len(windows)} window(s)", windows)]
    choice = review.choice()
    if choice.decision and choice.trial is not None:
        rounds = _confirm_windows(review, choice.trial.stage, "candidate")
        label = f"chosen {source_label(choice.trial)} + {len(rounds)} confirmation windows"
        sides.append((label, [choice.trial, *rounds]))
    elif (best := review.best()) is not None:
        sides.append((f"{source_label(best)} ({plots.UNCONFIRMED})", [best]))
    return sides


def request_sides(review: Review) -> list[tuple[str, pd.DataFrame]]:
    """Each side of :func:`cdf_sides` with its windows' requests pooled (a side whose trial
    folders are not here is left out)."""
    pooled = []
    for label, views in cdf_sides(review):
        frames = [f for f in (_requests(v) for v in views) if f is not None]
        if frames:
            pooled.append((label, pd.concat(frames, ignore_index=True)))
    return pooled


def cdf_data(
    review: Review, sides: list[tuple[str, pd.DataFrame]] | None = None
) -> list[CdfSeries]:
    """E2E and TTFT of every request of each side (:func:`cdf_sides`)."""
    found = request_sides(review) if sides is None else sides
    return [CdfSeries(label, f["e2e_s"].tolist(), f["ttft_s"].tolist()) for label, f in found]


def class_cdf_data(
    review: Review, sides: list[tuple[str, pd.DataFrame]] | None = None
) -> list[ClassCdf]:
    """Per request class, each side (:func:`cdf_sides`) on that class's requests only, of the
    metrics the class's SLOs bound (none set: E2E and TTFT); none where the workload has one
    class and no class SLO."""
    if not shows_classes(review):
        return []
    found = request_sides(review) if sides is None else sides
    slos = class_slos(review)
    return [_class_cdf(name, slos.get(name) or {}, found) for name in class_names(review)]


def _class_cdf(
    name: str, slos: dict[str, float], sides: list[tuple[str, pd.DataFrame]]
) -> ClassCdf:
    limits = {m: float(slos.get(f"p99_{m}_s") or 0.0) for m in CLASS_SLO_METRICS}
    limits = {m: limit for m, limit in limits.items() if limit > 0}
    metrics = list(limits) or list(class_plots.DEFAULT_METRICS)
    series = []
    for label, frame in sides:
        if "request_class" not in frame:  # records from before request classes
            continue
        own = frame[frame["request_class"].astype(str) == name]
        if not own.empty:
            series.append(ClassSeries(label, {m: _latencies(own, m) for m in metrics}))
    return ClassCdf(name, metrics, limits, series)


def _latencies(frame: pd.DataFrame, metric: str) -> list[float]:
    """Seconds per request; TPOT as the measurement computes it, (E2E - TTFT) over the output
    tokens after the first, for requests with more than one."""
    if metric != "tpot":
        values = frame[f"{metric}_s"]
    elif "output_tokens" in frame:
        many = frame[frame["output_tokens"] > 1]
        values = (many["e2e_s"] - many["ttft_s"]) / (many["output_tokens"] - 1)
    else:
        return []
    return [float(v) for v in values.dropna()]
