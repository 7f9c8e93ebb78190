"""The quality gate as a constraint: a precision change is feasible only within tolerance.

``ctx.quality_excess`` holds, per gated metric, ``(baseline - candidate) - tolerance`` (built by
``tuner.quality.attach_quality``); the violation is the largest of them, so the trial is feasible
exactly when no gated metric dropped by more than its tolerance.
"""

from __future__ import annotations

from tuner import (
    NO_DATA_VIOLATION,
    UNSET_SLO,
    Constraint,
    Measurements,
    ObjectiveContext,
    register_constraint,
)


@register_constraint
class QualityVsBaseline(Constraint):
    name = "quality_vs_baseline"
    description = (
        "max over quality.metrics of (baseline - candidate) - tolerance; -1 where the gate does "
        "not apply (stages that change no precision)"
    )

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        excess = ctx.quality_excess
        if excess is None:
            return UNSET_SLO  # not a precision stage: nothing to check
        if not excess:
            return NO_DATA_VIOLATION  # gated, but no quality data: never pass unchecked
        return max(excess.values())
