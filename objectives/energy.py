"""Energy per million output tokens, from the GPUs' NVML energy counters (cuda only)."""

from __future__ import annotations

import math

from tuner import (
    MINIMIZE,
    Measurements,
    Objective,
    ObjectiveContext,
    has_traffic,
    register_objective,
)

PER_MILLION = 1e6


@register_objective
class EnergyPerMillionTokens(Objective):
    name = "energy_per_million_tokens"
    direction = MINIMIZE
    unit = "J"
    description = "GPU joules per 1M output tokens (mean power / output tok/s)"

    def available(self, ctx: ObjectiveContext) -> bool:
        return ctx.device == "cuda"  # CPU builds have no energy counter that we read

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        if not has_traffic(m) or ctx.energy_j is None or ctx.window_s <= 0:
            return math.nan
        if m.output_throughput <= 0:
            return math.inf
        # Power over the energy window, divided by the token rate over the measure window:
        # robust to the two windows not being exactly the same length.
        watts = ctx.energy_j / ctx.window_s
        return watts / m.output_throughput * PER_MILLION
