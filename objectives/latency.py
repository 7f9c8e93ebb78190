"""Tail-latency objectives (seconds, lower is better)."""

from __future__ import annotations

from tuner import (
    MINIMIZE,
    Measurements,
    Objective,
    ObjectiveContext,
    register_objective,
    stat_or_nan,
)


@register_objective
class P99E2ELatency(Objective):
    name = "p99_e2e_latency"
    direction = MINIMIZE
    unit = "s"
    description = "P99 end-to-end latency of completed requests"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        return stat_or_nan(m.e2e.p99)


@register_objective
class P99Ttft(Objective):
    name = "p99_ttft"
    direction = MINIMIZE
    unit = "s"
    description = "P99 time to first token of completed requests"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        return stat_or_nan(m.ttft.p99)
