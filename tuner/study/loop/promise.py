"""Where the plan promised a gain that the study did not hand over: the measurement that says why.

`tuner plan` estimates every point of the study's space before a launch. When its best point
within the SLOs beats the baseline's estimate and the study still keeps the baseline, a user
sees a plan that promised 1.5x and a study that found nothing. The estimate is never the
judge, a measurement is: so the summary names the measurement that contradicted it (the study's
launch of that point, or the nearest it launched, with what it read against the SLOs and the
baseline), or says that no launch came near it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial

from tuner.config import ParamSpec, SloConfig
from tuner.plan.planner import Planner
from tuner.plan.table import PlannedPoint
from tuner.schema import TrialAttr
from tuner.scoring.confidence import SloStatus
from tuner.scoring.feasibility import meets
from tuner.study.decision.stages import StudyResult, measured_ok
from tuner.study.loop.prescreen import rank_for


@dataclass(frozen=True)
class Promise:
    """The plan's best point within the SLOs, where it beats the baseline's estimate."""

    best: PlannedPoint
    baseline: PlannedPoint

    def text(self) -> str:
        return (
            f"the plan estimated {self.best.params} at {_estimate(self.best)} within the SLOs, "
            f"the baseline at {_estimate(self.baseline)}"
        )


def _estimate(p: PlannedPoint) -> str:
    e = p.estimate
    return (
        f"{e.tokens_s_gpu:.0f} output tok/s per GPU (TTFT {e.ttft_ms:.0f} ms, "
        f"TPOT {e.tpot_ms:.1f} ms)"
    )


def promised(
    planner: Planner,
    specs: dict[str, ParamSpec],
    slo: SloConfig,
    select_by: str,
    min_gain: float,
) -> Promise | None:
    """The estimator's best point of ``specs`` whose estimate meets the SLOs, when it beats the
    baseline's (the fixed args alone) by more than ``min_gain``; else None."""
    rank = rank_for(select_by)
    points, _, _ = planner.space(specs)
    meeting = [p for p in points if p.estimate.starts and p.meets(slo)]
    base = planner.planned({})
    if not meeting or not math.isfinite(rank(base)):
        return None
    best = min(meeting, key=rank)
    if rank(best) >= rank(base) - min_gain * abs(rank(base)):
        return None
    return Promise(best, base)


def nearest_launch(params: dict[str, Any], trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The launched trial whose full params share most values with ``params`` (the latest of
    equals): the study's measurement of that point, or the closest it came to it."""
    launched = [t for t in trials if TrialAttr.STATUS in t.user_attrs]

    def shared(t: FrozenTrial) -> int:
        full = t.user_attrs.get(TrialAttr.PARAMS_ALL) or t.params
        return sum(full.get(k) == v for k, v in params.items())

    return max(reversed(launched), key=shared, default=None)


def against_the_plan(
    planner: Planner,
    specs: dict[str, ParamSpec],
    slo: SloConfig,
    select_by: str,
    min_gain: float,
    trials: Sequence[FrozenTrial],
    result: StudyResult,
    names: Sequence[str],
) -> list[str]:
    """The summary's lines where the plan promised a gain within the SLOs that the study did
    not hand over, whether it kept the baseline or handed over another point (an SLO-only
    step at the baseline's TP, say): [] where it handed over the promise or none was made.
    ``trials``: every launch of the study's stages."""
    promise = promised(planner, specs, slo, select_by, min_gain)
    return [] if promise is None else contradiction_lines(promise, trials, result, names)


def contradiction_lines(
    promise: Promise, trials: Sequence[FrozenTrial], result: StudyResult, names: Sequence[str]
) -> list[str]:
    """What the summary says when a study keeps its baseline against the plan's promise, or
    hands over another point than the one promised (a rehearsal at TP 8 where the plan said
    TP 2): the measurement that contradicted the estimate, and the stage winners on the way
    to that point that the repeats kept out."""
    final = result.final
    if final.source == result.baseline.source:
        lines = [f"  {promise.text()}; the study kept the baseline:"]
    elif any(final.params.get(k) != v for k, v in promise.best.params.items()):
        lines = [f"  {promise.text()}; the study handed over {final.params} instead:"]
    else:
        return []
    trial = nearest_launch(promise.best.params, trials)
    if trial is None:
        return [*lines, "    no launch of the study came near that point"]
    return [*lines, _nearest_line(promise, trial, result, names), *_kept_out(promise, result)]


def _nearest_line(
    promise: Promise, trial: FrozenTrial, result: StudyResult, names: Sequence[str]
) -> str:
    """What the launch nearest the promised point read, against the SLOs and the baseline."""
    full = trial.user_attrs.get(TrialAttr.PARAMS_ALL) or trial.params
    exact = all(full.get(k) == v for k, v in promise.best.params.items())
    where = "that point" if exact else f"the nearest point it launched, {full}"
    label = trial.user_attrs.get(TrialAttr.STAGE, "?")
    head = f"    the study measured {where} ({label} trial {trial.number}): "
    if not measured_ok(trial):
        reason = trial.user_attrs.get(TrialAttr.FAILURE_REASON, "failed")
        return f"{head}it failed ({reason}), where the plan said it fits"
    missed = {n: v for n, v in trial.constraints.items() if v > 0}
    if missed:
        over = ", ".join(f"{n} over by {v:.0%}" for n, v in sorted(missed.items()))
        return f"{head}{over}: that measurement contradicts the estimate"
    values = ", ".join(f"{n} {v:.4g}" for n, v in zip(names, trial.values, strict=False))
    base = ", ".join(f"{v:.4g}" for v in result.baseline.values)
    feasible = "met the SLOs" if meets(trial.constraints) else "missed an SLO"
    return (
        f"{head}{feasible} in its window but read {values} against the baseline's ({base}): "
        "no gain beyond the noise there"
    )


def _kept_out(promise: Promise, result: StudyResult) -> list[str]:
    """The stage winners on the way to the promised point (each sets a param to its promised
    value) whose repeats did not show every SLO met. A stage that keeps its incumbent leaves
    its winner out of every later stage, so the point it leads to is never launched: the
    repeats, not one search window, are what kept the study from it."""
    lines = []
    for d in result.decisions:
        short = [c for c in d.candidate_slos if c.status != SloStatus.MET]
        toward = any(promise.best.params.get(k) == v for k, v in d.candidate_params.items())
        if d.accepted or not short or not toward:
            continue
        said = "; ".join(c.text() for c in short)
        lines.append(
            f"    the {d.stage} stage's winner {d.candidate_params} (trial {d.candidate_trial}), "
            f"a step toward that point: its repeats read {said}; the stage kept its incumbent, "
            "so no later stage searched from it"
        )
    return lines
