"""A stage of a study: one parameter group searched against the incumbent.

The plan (which groups, in which order, or all of them at once for the joint strategy), the
incumbent that enters a stage, and what a finished study returns. A stage's trials, as the
storage holds them, are read through :class:`tuner.study.state.stored_stage.StoredStage`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from tuner.config import ParamSpec
from tuner.schema import Role, TrialAttr, TrialStatus
from tuner.scoring.confidence import SloClaim, SloStatus, claims
from tuner.scoring.feasibility import mean_constraints, meets, violation
from tuner.search import space as search_space
from tuner.study.decision.acceptance import Decision


@dataclass
class Stage:
    name: str
    specs: dict[str, ParamSpec]
    trials: int  # search trials of this stage (the incumbent seed and confirmations aside)


@dataclass
class Incumbent:
    """The best configuration so far: explicit params on top of the fixed args."""

    params: dict[str, Any]
    values: list[float]  # every objective; the selection objective at its mean over samples
    constraints: dict[str, float]  # each at its mean over the measurements
    source: str
    samples: list[float] = field(default_factory=list)  # its selection-objective measurements
    # its constraints per measurement, the windows `constraints` is the mean of (SLO-edge check)
    constraint_windows: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Repeats:
    """One side of a confirmation: its selection-objective values and constraint sets, one per
    measurement (the search or incumbent measurement first, then the re-measurements)."""

    values: list[float]
    constraints: list[dict[str, float]]


@dataclass
class StudyResult:
    baseline: Incumbent
    final: Incumbent
    decisions: list[Decision] = field(default_factory=list)
    pareto: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    slo_confidence: float = 0.9  # study.slo_confidence: what a claim of the hand-over must reach

    def final_claims(self) -> list[SloClaim]:
        """What the hand-over's windows claim of each SLO, at the study's confidence, their
        spread pooled over every configuration the study measured more than once."""
        final = self.final.constraint_windows or [dict(self.final.constraints)]
        groups = [self.baseline.constraint_windows]
        for d in self.decisions:
            groups += [d.candidate_constraint_windows, d.incumbent_constraint_windows]
        others = [g for g in groups if g and g != final]
        return claims(final, others, self.slo_confidence)

    def undecided_beside(self) -> list[Decision]:
        """Stage winners that beat the incumbent beyond the noise but were not handed over
        because an SLO stayed undecided: named beside the hand-over, never as feasible."""
        return [
            d
            for d in self.decisions
            if not d.accepted
            and d.gain > d.threshold
            and any(c.status == SloStatus.UNDECIDED for c in d.candidate_slos)
        ]


def measured_ok(trial: optuna.trial.FrozenTrial) -> bool:
    """The trial's server ran and its load was measured (not a failed start or load)."""
    return trial.user_attrs.get(TrialAttr.STATUS) == TrialStatus.OK


def ok_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if measured_ok(t)]


def baseline_incumbent(trials: Sequence[optuna.trial.FrozenTrial], select_index: int) -> Incumbent:
    """The control as the first incumbent: the means of the baseline's measurements."""
    values = [float(v) for v in np.mean([t.values for t in trials], axis=0)]
    constraints = mean_constraints([t.constraints for t in trials])
    samples = [t.values[select_index] for t in trials]
    windows = [dict(t.constraints) for t in trials]
    return Incumbent({}, values, constraints, Role.BASELINE, samples, windows)


def spec_text(spec: ParamSpec) -> str:
    choices = search_space.choices_of(spec)
    if choices is not None:
        return str(choices)
    return f"[{spec.low}, {spec.high}]{' log' if spec.log else ''}"


def stage_winner(
    trials: Sequence[optuna.trial.FrozenTrial],
    select_index: int,
    select_sign: float,
    incumbent: Incumbent | None = None,
) -> optuna.trial.FrozenTrial | None:
    """The best feasible of a stage's ``trials`` by the selection objective; with an
    ``incumbent`` that violates a constraint and no feasible trial, the nearest miss closer than
    the incumbent (a single window's P99 cannot rule it out: it goes to the confirmation, and is
    accepted only if it meets every constraint on the mean of its repeats)."""
    measured = [t for t in trials if measured_ok(t)]
    feasible = [t for t in measured if meets(t.constraints)]
    if feasible:
        return max(feasible, key=lambda t: select_sign * t.values[select_index])
    if incumbent is None or meets(incumbent.constraints) or not measured:
        return None
    near = min(measured, key=lambda t: violation(t.constraints))
    return near if violation(near.constraints) < violation(incumbent.constraints) else None


def point_key(params: dict[str, Any]) -> str:
    """A point's identity among a stage's trials (its params, in any order)."""
    return repr(sorted(params.items()))


def jsonable(value: Any) -> Any:
    """``value`` as JSON gives it back (what Optuna stores in attrs)."""
    return json.loads(json.dumps(value, default=str))


def after_decision(
    incumbent: Incumbent, decision: Decision, select_index: int, stage: str
) -> Incumbent:
    """The incumbent after a stage's decision: the candidate if accepted, else the incumbent
    with what its re-measurements taught (the selection objective and the constraints at their
    means over its repeats), so that later stages compare against the better estimate."""
    if not decision.accepted:
        if not decision.incumbent_constraints:
            return incumbent
        values = list(incumbent.values)
        values[select_index] = decision.incumbent_mean
        constraints = dict(decision.incumbent_constraints)
        samples = list(decision.incumbent_values)
        windows = list(decision.incumbent_constraint_windows)
        return Incumbent(incumbent.params, values, constraints, incumbent.source, samples, windows)
    # The winner's own objectives, with the selection objective at its confirmed mean.
    values = list(decision.candidate_objectives or incumbent.values)
    values[select_index] = decision.candidate_mean
    return Incumbent(
        dict(decision.candidate_params),
        values,
        dict(decision.candidate_constraints),
        f"{stage} trial {decision.candidate_trial}",
        list(decision.candidate_values),
        list(decision.candidate_constraint_windows),
    )
