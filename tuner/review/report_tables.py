"""The tables of `tuner report`, from the storage: every measurement, the baseline, the stages,
the failures, and each stage's parameter importances.

Tables: :func:`trials_frame` (one row per measurement: a reused one is listed where it was
taken), :func:`baseline_frame`, :func:`stages_frame` (from :func:`stage_outcomes`),
:func:`failures_frame`, :func:`slos_frame` (the hand-over's SLOs); :func:`importances` feeds
the importances figure. Every comparison with the baseline uses its mean over all its measured
windows (see :mod:`tuner.review.report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution

from tuner.review.diagnosis import diagnose
from tuner.review.slos import COLUMNS, HandoverSlos, row
from tuner.review.stored import Review, TrialView, nondominated
from tuner.schema import Role, TrialAttr
from tuner.scoring.feasibility import mean_constraints, meets
from tuner.study.decision.acceptance import Decision

# -- trials ----------------------------------------------------------------------------------


def reused(view: TrialView) -> bool:
    """A repeated proposal answered with another trial's measurement (no launch of its own)."""
    return TrialAttr.REUSED_FROM in view.attrs


def source_label(view: TrialView) -> str:
    """The label of the window a trial's numbers come from (its own unless reused)."""
    if not reused(view):
        return view.label
    stage = view.attrs.get(TrialAttr.REUSED_FROM_STAGE) or view.stage
    return f"{stage}#{view.attrs[TrialAttr.REUSED_FROM]}"


def listed_trials(review: Review) -> list[TrialView]:
    """Each measurement once: the baseline's windows, the stages' own trials, confirmations."""
    staged = [v for st in review.stages for v in review.stage_trials(st)]
    own = [v for v in staged if v.role != Role.INCUMBENT and not reused(v)]
    return [*review.baseline_windows, *own, *review.confirm_trials()]


def baseline_feasible(review: Review) -> bool:
    """The baseline meets its constraints on the mean of its windows (as the rule judges it)."""
    windows = review.baseline_windows
    return bool(windows) and meets(mean_constraints([v.trial.constraints for v in windows]))


def pareto_labels(review: Review, listed: list[TrialView]) -> set[str]:
    """Pareto-optimal feasible search windows, and the baseline's mean (as ``baseline``)."""
    shown = [v for v in listed if v.role == Role.SEARCH and v.feasible and v.measured]
    pool = [(v.label, list(v.trial.values)) for v in shown]
    base = [review.baseline_mean(n) for n in review.objectives]
    if baseline_feasible(review) and None not in base:
        pool.append((Role.BASELINE.value, base))
    if not pool:
        return set()
    front = nondominated(np.array([vals for _, vals in pool], dtype=float), review.directions)
    return {pool[i][0] for i in front}


def _row(review: Review, view: TrialView, pareto: set[str], reusers: list[str]) -> dict[str, Any]:
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
        "pareto": (Role.BASELINE if view.stage == Role.BASELINE else view.label) in pareto,
        "reused_by": ", ".join(reusers),
        "failure_reason": a.get("failure_reason") or "",
        "failure_message": a.get("failure_message") or "",
        "bottleneck": diag.bottleneck,
        "bottleneck_evidence": "; ".join(diag.evidence),
        # vLLM's own prefix-cache hits over queries in the trial (None: no cache or no query)
        "prefix_cache_hit_rate": view.telemetry.get("metrics", {}).get("prefix_cache_hit_rate"),
        # with --speculative-config: the share of proposed tokens vLLM accepted in the trial
        "spec_decode_acceptance_rate": view.telemetry.get("metrics", {}).get(
            "spec_decode_acceptance_rate"
        ),
        "duration_s": view.trial.duration.total_seconds() if view.trial.duration else None,
        "folder": a.get("folder") or "",
    }
    row.update({n: review.value(view, n) for n in review.objectives})
    row.update({f"param_{k}": v for k, v in view.params.items()})
    row.update({k: view.metric(k[2:]) for k in a if k.startswith("m_")})
    return row


def _reusers(review: Review) -> dict[str, list[str]]:
    """For each measured window, the repeated proposals it answered."""
    out: dict[str, list[str]] = {}
    for stage in review.stages:
        for v in review.stage_trials(stage):
            if reused(v):
                out.setdefault(source_label(v), []).append(v.label)
    return out


def trials_frame(review: Review) -> pd.DataFrame:
    """Every measurement once (baseline windows first, then stages, confirmations)."""
    listed = listed_trials(review)
    pareto, reusers = pareto_labels(review, listed), _reusers(review)
    rows = [_row(review, v, pareto, reusers.get(v.label, [])) for v in listed]
    return pd.DataFrame(rows)


def failures_frame(trials: pd.DataFrame) -> pd.DataFrame:
    cols = ["label", "stage", "failure_reason", "failure_message", "folder"]
    if trials.empty:
        return pd.DataFrame(columns=cols)
    return trials.loc[trials["status"] != "ok", cols].reset_index(drop=True)


def baseline_frame(review: Review) -> pd.DataFrame:
    """Per objective: the baseline's mean over its windows, and their range."""
    rows = []
    for n in review.objectives:
        found = [x for x in (review.value(v, n) for v in review.baseline_windows) if x is not None]
        low, high = min(found, default=None), max(found, default=None)
        rows.append([n, review.baseline_mean(n), low, high, len(found)])
    return pd.DataFrame(rows, columns=["objective", "mean", "min", "max", "windows"])


def slos_frame(slos: HandoverSlos) -> pd.DataFrame:
    """ "SLOs of the hand-over": per SLO its margin, the confidence of its windows, its status
    (met, UNDECIDED, MISSED) and how many windows it rests on; as words, ready to print."""
    return pd.DataFrame([row(c) for c in slos.shown()], columns=COLUMNS)


# -- stages ----------------------------------------------------------------------------------


def _change(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return 100.0 * (value - base) / abs(base)


@dataclass(frozen=True)
class SearchWindow:
    """A stage winner's one search window against the baseline's mean: never confirmed."""

    label: str
    values: dict[str, float | None]
    vs_baseline_pct: dict[str, float | None]  # (value - mean) / |mean|, in %


@dataclass(frozen=True)
class StageOutcome:
    """What a stage measured and what its stored decision concluded."""

    stage: str
    launched: int  # search trials with a launch of their own (failed ones too)
    reused: int  # repeated proposals answered with a stored measurement
    failed: int
    winner: SearchWindow | None
    decision: Decision | None


def _window(review: Review, view: TrialView) -> SearchWindow:
    values = {n: review.value(view, n) for n in review.objectives}
    change = {n: _change(x, review.baseline_mean(n)) for n, x in values.items()}
    return SearchWindow(source_label(view), values, change)


def _winner(review: Review, stage: str, decision: Decision | None) -> TrialView | None:
    """The search trial the decision confirmed, else the stage's best feasible window."""
    number = decision.candidate_trial if decision else None
    found = [v for v in review.stage_trials(stage) if number is not None and v.number == number]
    return found[0] if found else review.best(stage)


def _outcome(review: Review, stage: str) -> StageOutcome:
    search = [v for v in review.stage_trials(stage) if v.role == Role.SEARCH]
    copies = [v for v in search if reused(v)]
    decision = review.decision(stage)
    winner = _winner(review, stage, decision)
    window, failed = (_window(review, winner) if winner else None), sum(not v.ok for v in search)
    return StageOutcome(stage, len(search) - len(copies), len(copies), failed, window, decision)


def stage_outcomes(review: Review) -> list[StageOutcome]:
    return [_outcome(review, stage) for stage in review.stages]


def _decision_cells(d: Decision | None) -> dict[str, Any]:
    if d is None:
        return {"accepted": False, "decision": "(not decided yet)"}
    return {
        "accepted": d.accepted,
        "decision": d.reason,
        "decided_by": d.objective,
        "incumbent_mean": d.incumbent_mean,
        "candidate_mean": d.candidate_mean,
        "gain": d.gain,
        "needed_gain": d.threshold,
        "windows": f"{len(d.incumbent_values)}+{len(d.candidate_values)}",
        # every other objective's change on the same windows, with what those windows resolve
        "other_objectives": "; ".join(o.text() for o in d.others),
    }


def stages_frame(outcomes: list[StageOutcome], objectives: list[str]) -> pd.DataFrame:
    """Per stage: the decision first (what the study concluded), then the winner's search
    window against the baseline's mean."""
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {"stage": o.stage, **_decision_cells(o.decision)}
        row.update({"trials": o.launched, "reused": o.reused, "failed": o.failed})
        w = o.winner or SearchWindow("", {}, {})
        row["winner"] = w.label
        for n in objectives:
            row[f"{n}_search"] = w.values.get(n)
            row[f"{n}_search_vs_baseline_pct"] = w.vs_baseline_pct.get(n)
        rows.append(row)
    return pd.DataFrame(rows)


def importances(review: Review) -> dict[str, dict[str, float]]:
    """Per stage, PED-ANOVA importances of the params for the selection objective."""
    out: dict[str, dict[str, float]] = {}
    for stage in review.stages:
        views = [
            v for v in review.stage_trials(stage) if v.measured and v.trial.params and not reused(v)
        ]
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
