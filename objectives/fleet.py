"""Objectives for GPU fleets: output tokens/s per GPU and per user (higher is better).

They are the two axes of vLLM's plot_pareto and of public serving leaderboards: what one GPU
of the fleet produces, and how fast one user sees tokens stream (interactivity, 1 / TPOT).
"""

from __future__ import annotations

import math

from tuner import (
    MAXIMIZE,
    Measurements,
    Objective,
    ObjectiveContext,
    has_traffic,
    register_objective,
)


@register_objective
class OutputThroughputPerGpu(Objective):
    name = "output_throughput_per_gpu"
    direction = MAXIMIZE
    unit = "tok/s/GPU"
    description = "output tokens per second over the GPUs the server occupies (TP x PP x DP)"

    def available(self, ctx: ObjectiveContext) -> bool:
        return ctx.device == "cuda"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        if not has_traffic(m) or ctx.gpus_used < 1:
            return math.nan  # no GPUs counted: no per-GPU figure, never a fake best
        return m.output_throughput / ctx.gpus_used


@register_objective
class OutputThroughputPerUser(Objective):
    name = "output_throughput_per_user"
    direction = MAXIMIZE
    unit = "tok/s/user"
    description = "tokens per second one user sees while streaming: 1 / median TPOT"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        tpot = m.tpot.p50
        if not has_traffic(m) or tpot is None or tpot <= 0:
            return math.nan  # no TPOT (one-token outputs or no traffic): no interactivity
        return 1.0 / tpot
