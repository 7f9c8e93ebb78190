"""`tuner report`: tables (pandas) and figures from the storage, as a terminal summary,
``report.html`` (figures embedded), PNGs, and every trial as CSV and Parquet.

Tables: :func:`trials_frame` (one row per trial: stage, role, status, objectives, params, flat
measurements, bottleneck, Pareto membership), :func:`stages_frame` (per stage: best feasible
trial, change against the baseline, the acceptance decision), :func:`failures_frame`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from optuna.distributions import BaseDistribution

from tuner.review import plots
from tuner.review.diagnosis import diagnose
from tuner.review.stored import Review, TrialView

FIGURES = ("pareto", "improvement", "latency_cdf", "importances")


def _row(review: Review, view: TrialView, pareto: set[str]) -> dict[str, Any]:
    a = view.attrs
    diag = diagnose(view.telemetry, view.ok, review.cores)
    row: dict[str, Any] = {
        "label": view.label,
        "study": view.study,
        "stage": view.stage,
        "number": view.number,
        "role": view.role or "search",
        "state": view.trial.state.name,
        "status": a.get("status", "ok" if view.ok else "failed"),
        "measured": view.measured,
        "feasible": view.feasible,
        "pareto": view.label in pareto,
        "failure_reason": a.get("failure_reason") or "",
        "failure_message": a.get("failure_message") or "",
        "bottleneck": diag.bottleneck,
        "bottleneck_evidence": "; ".join(diag.evidence),
        "duration_s": view.trial.duration.total_seconds() if view.trial.duration else None,
        "folder": a.get("folder") or "",
    }
    row.update({n: review.value(view, n) for n in review.objectives})
    row.update({f"param_{k}": v for k, v in view.params.items()})
    row.update({k: view.metric(k[2:]) for k in a if k.startswith("m_")})
    return row


def trials_frame(review: Review) -> pd.DataFrame:
    """Every trial of the study, one row each (baseline first, then stages, confirmations)."""
    pareto = {v.label for v in review.pareto()}
    rows = [_row(review, v, pareto) for v in review.trials()]
    return pd.DataFrame(rows)


def failures_frame(trials: pd.DataFrame) -> pd.DataFrame:
    cols = ["label", "stage", "failure_reason", "failure_message", "folder"]
    if trials.empty:
        return pd.DataFrame(columns=cols)
    return trials.loc[trials["status"] != "ok", cols].reset_index(drop=True)


def _change(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return 100.0 * (value - base) / abs(base)


def stages_frame(review: Review) -> pd.DataFrame:
    """Per stage: best feasible trial (by the selection objective) vs the baseline."""
    rows = []
    for stage in review.stages:
        views = [v for v in review.stage_trials(stage) if v.role == "search"]
        best = review.best(stage)
        decision = review.decisions.get(stage, {})
        row: dict[str, Any] = {
            "stage": stage,
            "trials": len(views),
            "failed": sum(not v.ok for v in views),
            "best": best.label if best else "",
            "accepted": bool(decision.get("accepted")),
            "decision": decision.get("reason", "(not decided yet)"),
        }
        for n in review.objectives:
            value = review.value(best, n) if best else None
            base = review.value(review.baseline, n) if review.baseline else None
            row[n], row[f"{n}_change_pct"] = value, _change(value, base)
        rows.append(row)
    return pd.DataFrame(rows)


def importances(review: Review) -> dict[str, dict[str, float]]:
    """Per stage, PED-ANOVA importances of the params for the selection objective."""
    out: dict[str, dict[str, float]] = {}
    for stage in review.stages:
        views = [v for v in review.stage_trials(stage) if v.measured and v.trial.params]
        values = [review.value(v, review.select_by) for v in views]
        pairs = [(v, x) for v, x in zip(views, values, strict=True) if x is not None]
        if len(pairs) < 3:
            continue  # PED-ANOVA compares a top quantile with the rest: needs a few trials
        try:
            out[stage] = _importance(pairs, review)
        except (ValueError, RuntimeError, ZeroDivisionError):
            continue
    return out


def _importance(pairs: list[tuple[TrialView, float]], review: Review) -> dict[str, float]:
    maximize = review.directions[review.objectives.index(review.select_by)] == "maximize"
    study = optuna.create_study(direction="maximize" if maximize else "minimize")
    for view, value in pairs:
        dists: dict[str, BaseDistribution] = dict(view.trial.distributions)
        study.add_trial(
            optuna.trial.create_trial(params=view.trial.params, distributions=dists, value=value)
        )
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    return optuna.importance.get_param_importances(study, evaluator=evaluator)


def latency_samples(review: Review, views: list[TrialView]) -> dict[str, pd.DataFrame]:
    """Measured-window request latencies of ``views`` from their requests.jsonl."""
    out = {}
    for view in views:
        path = view.folder / "requests.jsonl" if view.folder else None
        if path is None or not path.is_file():
            continue
        frame = pd.read_json(path, lines=True)
        if {"phase", "ok", "e2e_s", "ttft_s"} <= set(frame.columns):
            out[view.label] = frame[(frame["phase"] == "measure") & frame["ok"]]
    return out


@dataclass
class Report:
    """The tables and figures of one study, ready to print or write."""

    review: Review
    trials: pd.DataFrame
    stages: pd.DataFrame
    failures: pd.DataFrame
    importances: dict[str, dict[str, float]]
    figures: dict[str, bytes] = field(default_factory=dict)


def build_report(review: Review, figures: bool = True) -> Report:
    trials = trials_frame(review)
    stages = stages_frame(review)
    imps = importances(review)
    report = Report(review, trials, stages, failures_frame(trials), imps)
    if figures:
        report.figures = _figures(report)
    return report


def _figures(report: Report) -> dict[str, bytes]:
    review = report.review
    cost = next((n for n in review.objectives if "cost" in n), None)
    best = review.best()
    compared = [v for v in (review.baseline, best) if v is not None]
    return {
        "pareto": plots.png(plots.pareto_figure(report.trials, cost)),
        "improvement": plots.png(
            plots.improvement_figure(report.stages, review.objectives, review.directions)
        ),
        "latency_cdf": plots.png(plots.cdf_figure(latency_samples(review, compared))),
        "importances": plots.png(plots.importance_figure(report.importances, review.select_by)),
    }
