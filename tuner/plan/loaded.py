"""A point's estimate under the study's own load, where the study's load is a closed loop.

The estimator gives steady-state means at a full batch. A closed loop of ``U`` users on a server
that runs fewer at once (``max_num_seqs``, or a KV cache that holds fewer sequences) queues the
rest: their first tokens wait whole service times, and that wait is what breaks a TTFT SLO at
a small batch. :mod:`tuner.plan.queueing` turns the estimate at the batch that runs into what
the study's client would read; the simulated GPU host queues the same way, for real, so the
plan and the host agree on where queueing breaks an SLO. An open loop's steady concurrency is
unknown before a run: its estimate stands as the estimator gives it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.config import SloConfig
from tuner.plan.estimate import PointEstimate
from tuner.plan.planner import Planner
from tuner.plan.queueing import Load, Served, running, serve
from tuner.plan.table import PlannedPoint


@dataclass(frozen=True)
class Loaded:
    """A point as the study's load would find it: its estimate at the batch that runs, and
    (closed loop) what its client would read with the queue in front of that batch."""

    planned: PlannedPoint
    served: Served | None  # None: an open loop, whose estimate stands as it is

    def overshoot(self, slo: SloConfig, tolerance: float = 0.0) -> float:
        """How far what the client would read misses the P99 SLOs: each one's overshoot
        relative to its limit beyond ``tolerance``, summed (0 when all are met)."""
        if self.served is None:
            return max(0.0, self.planned.overshoot(slo) - tolerance)
        s = self.served
        limits = (
            (slo.p99_ttft_s, s.p99_ttft_s),
            (slo.p99_tpot_s, s.tpot_s),
            (slo.p99_e2e_s, s.p99_e2e_s),
        )
        return sum(max(0.0, value / limit - 1 - tolerance) for limit, value in limits if limit > 0)

    def meets(self, slo: SloConfig, tolerance: float = 0.0) -> bool:
        return self.overshoot(slo, tolerance) == 0


def loaded(planner: Planner, params: Mapping[str, Any]) -> Loaded | None:
    """``params`` (on top of the fixed args) under the study's workload; None where the
    estimator says it cannot start or cannot say (no latency to judge)."""
    first = planner.planned(params)
    e = first.estimate
    if not e.starts or math.isnan(e.ttft_ms):
        return None
    workload = planner.config.workload
    if workload.mode != "closed":
        return Loaded(first, None)
    load = Load(workload.concurrency, e.point.isl, e.point.osl)
    slots = None if e.kv_tokens is None else e.kv_tokens // load.tokens_per_request
    c = running(load, e.point.batch, slots)
    at_batch = e if c == e.point.batch else _at_batch(planner, e, c)
    if at_batch is None:
        return None
    planned = PlannedPoint(first.params, at_batch, first.price_per_hour)
    served = serve(load, c, at_batch.ttft_ms / 1000, at_batch.tpot_ms / 1000)
    return None if served is None else Loaded(planned, served)


def _at_batch(planner: Planner, e: PointEstimate, batch: int) -> PointEstimate | None:
    """The estimate at the batch the KV cache lets run (the cap's batch would preempt)."""
    if batch < 1:
        return None
    again = planner.estimator.estimate(dataclasses.replace(e.point, batch=batch))
    return again if again.starts and not math.isnan(again.ttft_ms) else None
