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
incumbent. No new lead is taken while one is followed, nor from the last stage.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from tuner.scoring.feasibility import meets, violation
from tuner.study.noise import NoiseEstimate
from tuner.study.stages import Incumbent, measured_ok

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
) -> optuna.trial.FrozenTrial | None:
    """The best near miss of a stage's search ``trials`` that beats a feasible ``incumbent``
    beyond the noise on its one window, or None."""
    if not meets(incumbent.constraints):
        return None  # the acceptance rule already steps toward feasibility from there
    near = [
        t for t in trials
        if measured_ok(t) and not meets(t.constraints)
        and violation(t.constraints) <= LEAD_MAX_OVERSHOOT
    ]  # fmt: skip
    if not near:
        return None
    best = max(near, key=lambda t: select_sign * t.values[select_index])
    mean = incumbent.values[select_index]
    noise = pooled.threshold(max(1, len(incumbent.samples)), 1, mean) if pooled else 0.0
    gain = select_sign * (best.values[select_index] - mean)
    return best if gain > max(noise, min_gain * abs(mean)) else None


def lead_incumbent(trial: optuna.trial.FrozenTrial, incumbent: Incumbent, stage: str,
                   select_index: int) -> Incumbent:  # fmt: skip
    """The lead as the point the next stage starts from (its one window as its measurement)."""
    return Incumbent(
        {**incumbent.params, **trial.params},
        list(trial.values),
        dict(trial.constraints),
        f"{stage} trial {trial.number} (lead)",
        [trial.values[select_index]],
    )


def lead_line(stage: str, trial: optuna.trial.FrozenTrial, incumbent: Incumbent,
              select_index: int, objective: str) -> str:  # fmt: skip
    gain = trial.values[select_index] / incumbent.values[select_index] - 1
    return (
        f"stage {stage}: trial {trial.number} {trial.params} missed the SLOs by "
        f"{violation(trial.constraints):.1%} but {objective} {gain:+.1%} on its window: the next "
        "stages search around it; the incumbent stays unless a feasible winner beats it"
    )
