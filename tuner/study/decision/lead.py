"""A lead: a stage's near miss that the next stage searches around, the incumbent kept.

Where two groups' knobs meet an SLO only together (a smaller TP serves more tokens per GPU but
its TTFT is over the SLO until the prefill chunk shrinks), a staged study that keeps its feasible
incumbent never tries the pair: each stage changes one group. So when, after a stage, the
incumbent is feasible and one of the stage's trials missed the SLOs by little (a summed overshoot
of at most :data:`LEAD_MAX_OVERSHOOT`, its server ran) while beating the incumbent beyond the
measured noise on its one window, the next stage searches around that trial instead.

A lead is never handed over: a stage's winner around it must meet every constraint and beat
the incumbent itself (confirmed against it, interleaved, as every winner is). The next stages
search around the lead until one accepts such a winner, for at most :data:`LEAD_STAGES` stages
(the group that fixes the SLO may come two stages later: memory before batching); then the
stages go back to the incumbent, and a study that ends with the lead unresolved hands over the
incumbent. No new lead is taken while one is followed, nor from the last stage. With
study.prescreen, the estimator may name a lead that no window shows
(:meth:`tuner.study.loop.prescreen.Prescreen.lead_ahead`); it is followed the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.scoring.feasibility import meets, violation
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.noise import NoiseEstimate
from tuner.study.decision.stages import Incumbent, measured_ok

# Summed relative overshoot of the SLOs a lead may have: within reach of one more group's knobs
# (the prefill chunk takes ~10 % off a P99 TTFT), and above a window's noise on a GPU (2-5 %).
LEAD_MAX_OVERSHOOT = 0.25
# Stages a lead is searched around before the study goes back to its incumbent: enough to reach
# a group two stages on, few enough that a lead no knob can fix leaves the later groups to it.
LEAD_STAGES = 2


def find_lead(
    trials: Sequence[optuna.trial.FrozenTrial],
    incumbent: Incumbent,
    select_index: int,
    select_sign: float,
    min_gain: float,
    pooled: NoiseEstimate | None,
    repeated: Mapping[int, dict[str, float]] | None = None,
) -> optuna.trial.FrozenTrial | None:
    """The best near miss of a stage's search ``trials`` that beats a feasible ``incumbent``
    beyond the noise on its one window, or None. ``repeated``: a trial's constraints on the mean
    of its repeats, where the confirmation re-measured it (they judge it instead of its window:
    a winner whose window read under an SLO and its repeats over it is a near miss)."""
    if not meets(incumbent.constraints):
        return None  # the acceptance rule already steps toward feasibility from there
    near = [
        t
        for t in trials
        if measured_ok(t)
        and not meets(judged(t, repeated))
        and violation(judged(t, repeated)) <= LEAD_MAX_OVERSHOOT
    ]
    if not near:
        return None
    best = max(near, key=lambda t: select_sign * t.values[select_index])
    mean = incumbent.values[select_index]
    noise = pooled.threshold(max(1, len(incumbent.samples)), 1, mean) if pooled else 0.0
    gain = select_sign * (best.values[select_index] - mean)
    return best if gain > max(noise, min_gain * abs(mean)) else None


def other_configurations(
    trials: Sequence[optuna.trial.FrozenTrial],
    incumbent: Incumbent,
    as_run: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[optuna.trial.FrozenTrial]:
    """The ``trials`` that launched another configuration than ``incumbent``'s, each compared
    as the server runs it (``as_run``: a flag left out reads as its default). Only those can
    lead: the incumbent's own configuration launched again, reading better on one window, is
    the noise its repeats already measure, and following it searches nothing new."""
    same = as_run(dict(incumbent.params))
    return [t for t in trials if as_run({**incumbent.params, **t.params}) != same]


def judged(
    trial: optuna.trial.FrozenTrial, repeated: Mapping[int, dict[str, float]] | None
) -> dict[str, float]:
    """A trial's constraints: on the mean of its repeats where it has them, else its window's."""
    return dict((repeated or {}).get(trial.number, trial.constraints))


def lead_incumbent(
    trial: optuna.trial.FrozenTrial,
    incumbent: Incumbent,
    stage: str,
    select_index: int,
    constraints: dict[str, float],
) -> Incumbent:
    """The lead as the point the next stage starts from (its one window as its measurement)."""
    return Incumbent(
        {**incumbent.params, **trial.params},
        list(trial.values),
        dict(constraints),
        f"{stage} trial {trial.number} (lead)",
        [trial.values[select_index]],
    )


def lead_line(
    stage: str,
    trial: optuna.trial.FrozenTrial,
    incumbent: Incumbent,
    select_index: int,
    objective: str,
    constraints: dict[str, float],
) -> str:
    gain = trial.values[select_index] / incumbent.values[select_index] - 1
    return (
        f"stage {stage}: trial {trial.number} {trial.params} missed the SLOs by "
        f"{violation(constraints):.1%} but {objective} {gain:+.1%} on its window: the next "
        "stages search around it; the incumbent stays unless a feasible winner beats it"
    )


def next_lead(
    trials: Sequence[optuna.trial.FrozenTrial],
    incumbent: Incumbent,
    decision: Decision,
    select: tuple[int, float],
    min_gain: float,
    pooled: NoiseEstimate | None,
) -> tuple[Incumbent, str] | None:
    """After a stage's ``decision``: the lead its search ``trials`` give the next stages, with
    the line that says so (a winner not handed over is judged by its repeats), or None.
    ``select``: the selection objective's index and sign."""
    repeated = re_measured(decision)
    idx, sign = select
    trial = find_lead(trials, incumbent, idx, sign, min_gain, pooled, repeated)
    if trial is None:
        return None
    constraints = judged(trial, repeated)
    line = lead_line(decision.stage, trial, incumbent, idx, decision.objective, constraints)
    return lead_incumbent(trial, incumbent, decision.stage, idx, constraints), line


def re_measured(decision: Decision) -> dict[int, dict[str, float]]:
    """The stage's winner that the confirmation re-measured and did not hand over, with its
    constraints on the mean of its repeats: passed over for a runner-up, or kept out with none
    confirmed (no other trial met the SLOs on its window, or no launches were left for one).
    Judged by its window it would be no near miss: that window read under the SLOs, which is
    why it won."""
    if decision.passed_over_trial is not None:
        return {decision.passed_over_trial: dict(decision.passed_over_constraints)}
    if decision.accepted or decision.candidate_trial is None or not decision.candidate_constraints:
        return {}
    return {decision.candidate_trial: dict(decision.candidate_constraints)}


@dataclass
class FollowedLead:
    """The lead the stages search around, if any, and for how many stages so far."""

    lead: Incumbent | None = None
    stages: int = 0

    def after(self, accepted: bool, find: Callable[[], Incumbent | None]) -> None:
        """After a stage's decision: a new lead is looked for (``find``) when the stage
        accepted a winner or followed none; one followed :data:`LEAD_STAGES` stages without
        a feasible winner is dropped, back to the incumbent."""
        self.stages = self.stages + 1 if self.lead else 0
        if accepted or self.lead is None:
            self.lead, self.stages = find(), 0
        elif self.stages >= LEAD_STAGES:
            self.lead = None
