"""`tuner report`: tables (pandas) and figures from the storage, as a terminal summary,
``report.html`` (figures embedded), PNGs, and every trial as CSV and Parquet.

Every comparison with the baseline uses its mean over all its measured windows: one window of a
shared machine can sit 20-40 % off, and a search window set against it shows gains the
acceptance decision rightly refused. Per stage the report keeps apart the winner's one search
window (never confirmed) and the stored decision (the confirmation rounds' means, the gain
they needed, the verdict).

The tables come from :mod:`tuner.review.report_tables`; this module assembles them into a
:class:`Report` and gathers the numbers behind each figure, drawn from
:class:`~tuner.review.plots.FigureData`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tuner.review import plots
from tuner.review.classes import classes_frame
from tuner.review.estimates import EstimateCheck, estimate_check
from tuner.review.plots import CdfSeries, FigureData, ImprovementData, ParetoData, PointKind
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

FIGURES = ("pareto", "improvement", "latency_cdf", "importances")


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
    data: FigureData | None = None
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
        report.figures = plots.render(report.data)
    return report


def figure_data(report: Report) -> FigureData:
    review = report.review
    return FigureData(
        pareto=pareto_data(review, report.trials),
        improvement=improvement_data(review, report.outcomes),
        latency_cdf=cdf_data(review),
        importances=plots.ImportanceData(review.select_by, report.importances),
    )


def _search_point(row: pd.Series, kind: PointKind, cost: str | None) -> plots.ParetoPoint:
    return plots.ParetoPoint(
        row["label"],
        kind,
        float(row[plots.X_COL]),
        float(row[plots.Y_COL]),
        None if cost is None or pd.isna(row.get(cost)) else float(row[cost]),
        bool(row["feasible"]),
        # a baseline window only shows the spread: the front goes through the baseline's mean
        bool(row["pareto"]) and kind == PointKind.SEARCH,
    )


def pareto_data(review: Review, trials: pd.DataFrame) -> ParetoData:
    """Search windows and baseline windows as measured; the baseline's mean as one point."""
    cost = next((n for n in review.objectives if "cost" in n), None)
    if trials.empty or not {plots.X_COL, plots.Y_COL} <= set(trials.columns):
        return ParetoData([], cost)
    shown = trials[trials["measured"] & trials[plots.X_COL].notna() & trials[plots.Y_COL].notna()]
    kinds = {Role.SEARCH: PointKind.SEARCH, Role.BASELINE: PointKind.BASELINE_WINDOW}
    rows = [r for _, r in shown.iterrows() if r["role"] in kinds]
    points = [_search_point(r, kinds[r["role"]], cost) for r in rows]
    base = shown[shown["stage"] == Role.BASELINE]
    if not base.empty:
        points.append(_baseline_point(review, base, cost))
    return ParetoData(points, cost)


def _baseline_point(review: Review, base: pd.DataFrame, cost: str | None) -> plots.ParetoPoint:
    return plots.ParetoPoint(
        "baseline (mean)",
        PointKind.BASELINE_MEAN,
        float(base[plots.X_COL].mean()),
        float(base[plots.Y_COL].mean()),
        review.baseline_mean(cost) if cost else None,
        baseline_feasible(review),
        bool(base["pareto"].any()),
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


def _series(label: str, views: list[TrialView]) -> CdfSeries | None:
    frames = [f for f in (_requests(v) for v in views) if f is not None]
    if not frames:
        return None
    pooled = pd.concat(frames)
    return CdfSeries(label, pooled["e2e_s"].tolist(), pooled["ttft_s"].tolist())


def _confirm_windows(review: Review, stage: str, side: str) -> list[TrialView]:
    """A stage's confirmation rounds of one side (``candidate`` or ``incumbent``)."""
    views = review.confirm_trials()
    tags = [(v, str(v.attrs.get(TrialAttr.CONFIRM_TAG, "")).split("/")) for v in views]
    return [v for v, tag in tags if len(tag) == 3 and tag[0] == stage and tag[2] == side]


def cdf_data(review: Review) -> list[CdfSeries]:
    """The baseline over all its windows against the chosen configuration over its search
    window and confirmation rounds; with no stage accepted, the best search window, marked."""
    windows = review.baseline_windows
    groups = [(f"baseline, all {len(windows)} window(s)", windows)]
    choice = review.choice()
    if choice.decision and choice.trial is not None:
        rounds = _confirm_windows(review, choice.trial.stage, "candidate")
        label = f"chosen {source_label(choice.trial)} + {len(rounds)} confirmation windows"
        groups.append((label, [choice.trial, *rounds]))
    elif (best := review.best()) is not None:
        groups.append((f"{source_label(best)} ({plots.UNCONFIRMED})", [best]))
    found = [_series(label, views) for label, views in groups]
    return [s for s in found if s is not None]
