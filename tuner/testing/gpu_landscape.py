"""A GPU landscape: one true measurement per configuration, noise drawn per launch.

The CPU tables (tuner.testing.landscape) hold measured repeats and score output tok/s under a
P99 E2E SLO. Here each configuration has one *truth* (a silicon measurement or an estimate
turned into a client's view by tuner.plan.queueing) and every launch sees it through
multiplicative noise at a stated coefficient of variation: independent factors
``max(0.05, 1 + cv * z)``, ``z ~ N(0, 1)``, one for the throughput (tokens and requests), one
for TTFT, one for TPOT and E2E. The study a replay of it runs (:func:`gpu_config`) maximises
output tokens/s per GPU (TP) under P99 TTFT and P99 TPOT SLOs; how a run on it is scored is
the benchmarks' business (benchmarks/gpu_scoring.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tuner.config import TunerConfig
from tuner.plan.queueing import Served
from tuner.testing.landscape import Key, Landscape, Measured
from tuner.testing.lookup import base_config

GPU_PARAM = "tensor_parallel_size"
WINDOW_S = 60.0  # a GPU study's window: only sets the request count of a replayed outcome


def point(tok_s_per_gpu: float, tp: int, ttft_s: float) -> Measured:
    """A measured point given by what a GPU landscape's tests vary: tok/s per GPU at a TP, and
    its TTFT (P50 = P99); everything else fixed and ordinary (1 s E2E, 10 ms TPOT, no errors)."""
    return Measured(
        ok=True,
        reason="",
        p50_e2e_s=1.0,
        p99_e2e_s=1.0,
        p50_ttft_s=ttft_s,
        p99_ttft_s=ttft_s,
        p50_tpot_s=0.01,
        p99_tpot_s=0.01,
        output_tok_s=tok_s_per_gpu * tp,
        request_per_s=tok_s_per_gpu * tp / 100,
        error_rate=0.0,
        completed=100,
        failed=0,
    )


def measured(served: Served | None, reason: str = "does_not_fit") -> Measured:
    """A client's measurement of one server (a failed start when ``served`` is None)."""
    if served is None:
        none = dict.fromkeys(
            ("p50_e2e_s", "p99_e2e_s", "p50_ttft_s", "p99_ttft_s")
        ) | dict.fromkeys(("p50_tpot_s", "p99_tpot_s"))
        return Measured(
            False,
            reason,
            **none,
            output_tok_s=0.0,
            request_per_s=0.0,
            error_rate=1.0,
            completed=0,
            failed=0,
        )
    return Measured(
        ok=True,
        reason="",
        p50_e2e_s=served.p50_e2e_s,
        p99_e2e_s=served.p99_e2e_s,
        p50_ttft_s=served.p50_ttft_s,
        p99_ttft_s=served.p99_ttft_s,
        p50_tpot_s=served.tpot_s,
        p99_tpot_s=served.tpot_s,
        output_tok_s=served.output_tok_s,
        request_per_s=served.request_per_s,
        error_rate=0.0,
        completed=max(1, round(served.request_per_s * WINDOW_S)),
        failed=0,
    )


@dataclass(frozen=True)
class GpuSlo:
    p99_ttft_s: float
    p99_tpot_s: float

    def met(self, m: Measured) -> bool:
        return (
            m.ok
            and (m.p99_ttft_s or math.inf) <= self.p99_ttft_s
            and (m.p99_tpot_s or math.inf) <= self.p99_tpot_s
        )


class GpuLandscape(Landscape):
    """``{key: [truth]}`` with per-launch multiplicative noise at ``cv``."""

    def __init__(
        self,
        params: Sequence[str],
        table: Mapping[Key, Measured],
        defaults: Mapping[str, Any],
        cv: float = 0.0,
    ) -> None:
        super().__init__(params, {k: [m] for k, m in table.items()}, defaults)
        self.cv = cv

    def with_noise(self, cv: float) -> GpuLandscape:
        return GpuLandscape(self.params, self.truths(), self.defaults, cv)

    def truths(self) -> dict[Key, Measured]:
        return {k: reps[0] for k, reps in self.table.items()}

    def true(self, key: Key) -> Measured:
        return self.table[key][0]

    def gpus(self, key: Key) -> int:
        return int(self.params_of(key).get(GPU_PARAM) or 1)

    def per_gpu(self, key: Key, m: Measured | None = None) -> float:
        return (m or self.true(key)).output_tok_s / self.gpus(key)

    def per_user(self, key: Key) -> float:
        tpot = self.true(key).p50_tpot_s
        return 1.0 / tpot if tpot else 0.0

    def draw(self, key: Key, rng: np.random.Generator) -> Measured:
        m = super().draw(key, rng)
        if not m.ok or self.cv == 0:
            return m
        tok, ttft, tpot = (max(0.05, 1 + self.cv * z) for z in rng.standard_normal(3))
        return replace(
            m,
            output_tok_s=m.output_tok_s * tok,
            request_per_s=m.request_per_s * tok,
            p50_ttft_s=_times(m.p50_ttft_s, ttft),
            p99_ttft_s=_times(m.p99_ttft_s, ttft),
            p50_tpot_s=_times(m.p50_tpot_s, tpot),
            p99_tpot_s=_times(m.p99_tpot_s, tpot),
            p50_e2e_s=_times(m.p50_e2e_s, tpot),
            p99_e2e_s=_times(m.p99_e2e_s, tpot),
        )


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


# ---- the GPU study a replay runs -----------------------------------------------------------
# Stage groups: the GPU knobs each stage searches, as conf/study/llama70b_8xh200.yaml names them.
GROUPS = {
    "parallelism": [GPU_PARAM],
    "quantization": ["quantization", "kv_cache_dtype"],
    "memory": ["gpu_memory_utilization"],
    "batching": ["max_num_seqs", "max_num_batched_tokens"],
}
OBJECTIVES = ["output_throughput_per_gpu", "output_throughput_per_user"]


def groups_of(land: GpuLandscape, order: Sequence[str]) -> dict[str, list[str]]:
    """The stages in this order, each with the landscape's params (a stage without any is left
    out: a silicon table has only parallelism and batching)."""
    out = {g: [p for p in GROUPS[g] if p in land.params] for g in order}
    return {g: ps for g, ps in out.items() if ps}


def gpu_config(land: GpuLandscape, slo: GpuSlo) -> TunerConfig:
    """compose([]) made a GPU study: objectives per GPU and per user, TTFT and TPOT SLOs, and
    the defaults' TP as the fixed arg (so the baseline's tok/s is divided by its GPUs)."""
    config = base_config()
    config.server.device = "cuda"
    config.server.args = {GPU_PARAM: land.defaults[GPU_PARAM]}
    config.objectives.names = list(OBJECTIVES)
    config.objectives.select_by = OBJECTIVES[0]
    config.objectives.constraints = ["slo_p99_ttft", "slo_p99_tpot", "error_rate"]
    config.slo.p99_ttft_s, config.slo.p99_tpot_s = slo.p99_ttft_s, slo.p99_tpot_s
    return config
