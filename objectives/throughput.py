"""Throughput objectives (higher is better)."""

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
class OutputThroughput(Objective):
    name = "output_throughput"
    direction = MAXIMIZE
    unit = "tok/s"
    description = "output tokens per second of completed requests over the window"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        # 0 tok/s with traffic is a real (worst) result; without traffic there is no result.
        return m.output_throughput if has_traffic(m) else math.nan


@register_objective
class OutputTokenRate(Objective):
    name = "output_token_rate"
    direction = MAXIMIZE
    unit = "tok/s"
    description = "output tokens generated inside the window per second (token timestamps)"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        # Smooth where output_throughput steps by whole requests (a window of few latencies).
        rate = m.output_token_rate
        return rate if has_traffic(m) and rate is not None else math.nan


@register_objective
class Goodput(Objective):
    name = "goodput"
    direction = MAXIMIZE
    unit = "req/s"
    description = "completed requests per second that met every set SLO"

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        return m.goodput if has_traffic(m) else math.nan
