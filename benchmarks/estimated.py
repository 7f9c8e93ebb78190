"""Estimated GPU landscapes: AIConfigurator's static estimates through a closed-loop queue.

For each configuration of TP x max_num_seqs x max_num_batched_tokens x weight quantization x
KV-cache dtype x gpu_memory_utilization, AIConfigurator's core API (aiconfigurator-core 0.12,
its vLLM 0.24 data, offline) gives the KV-cache capacity at that memory fraction and the mean
TTFT and TPOT at a batch of ``c`` running requests with ``max_num_batched_tokens`` as the
prefill chunk; tuner.plan.queueing turns them into what ``users`` closed-loop clients measure.
A configuration whose weights leave no KV budget ("no KV budget") or whose KV cache cannot hold
one request is a failed start. AIConfigurator calls its own results means at full batch; the
tails are the queueing model's, and absolute TTFT is off by a third or more against silicon
(benchmarks/findings/plan-fidelity.md): these landscapes test search, not a deployment.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from tuner import Load, running, serve
from tuner.testing.gpu_landscape import GPU_PARAM, GpuLandscape, measured
from tuner.testing.landscape import Key

AXES: dict[str, list[Any]] = {
    GPU_PARAM: [1, 2, 4, 8],
    "max_num_seqs": [64, 128, 256, 512, 1024],
    "max_num_batched_tokens": [2048, 8192],
    "quantization": ["none", "fp8"],
    "kv_cache_dtype": ["auto", "fp8"],
    "gpu_memory_utilization": [0.8, 0.9, 0.95],
}
# vLLM's defaults on an 80+ GiB Hopper GPU (V1 engine, OpenAI server): 1024 sequences, 8192
# batched tokens, 0.9 of the memory, the checkpoint's precision, TP 1.
VLLM_DEFAULTS: dict[str, Any] = {
    GPU_PARAM: 1,
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192,
    "quantization": "none",
    "kv_cache_dtype": "auto",
    "gpu_memory_utilization": 0.9,
}
GEMM = {"none": "bfloat16", "fp8": "fp8"}
KV = {"auto": "bfloat16", "fp8": "fp8"}
VERSION = "0.24.0"  # AIConfigurator's vLLM data (given explicitly: ~9 ms an estimate, not 1.3 s)


@dataclass(frozen=True)
class System:
    name: str
    model: str  # an AIConfigurator model config name (offline)
    gpu: str
    load: Load
    defaults: dict[str, Any]


SYSTEMS = {
    s.name: s
    for s in (
        System(
            "llama8b_h100",
            "meta-llama/Meta-Llama-3.1-8B",
            "h100_sxm",
            Load(256, 1024, 256),
            VLLM_DEFAULTS,
        ),
        System(
            "llama8b_h200",
            "meta-llama/Meta-Llama-3.1-8B",
            "h200_sxm",
            Load(256, 1024, 256),
            VLLM_DEFAULTS,
        ),
        # vLLM's TP 1 cannot hold 70B in bf16; a user starts from the whole node.
        System(
            "llama70b_8xh200",
            "meta-llama/Meta-Llama-3.1-70B",
            "h200_sxm",
            Load(128, 1024, 256),
            {**VLLM_DEFAULTS, GPU_PARAM: 8},
        ),
    )
}


class Estimator:
    """AIConfigurator's estimates for one model on one GPU (imports it only when used)."""

    def __init__(self, system: System) -> None:
        from aiconfigurator_core.sdk.perf_database import get_database_view

        self.system = system
        self.db = get_database_view(system.gpu, "vllm", VERSION)
        self._latency: dict[tuple[int, str, str, int, int], tuple[float, float]] = {}
        self._current: tuple[Any, Any] = (None, None)

    def kv_tokens(self, tp: int, quant: str, kv: str, gmu: float) -> int | None:
        """KV-cache tokens at this memory fraction; None when the weights leave no budget."""
        from aiconfigurator_core.sdk.memory import estimate_kv_cache

        try:
            est = estimate_kv_cache(
                self.system.model,
                self.system.gpu,
                "vllm",
                VERSION,
                max_num_tokens=8192,
                max_batch_size=self.system.load.users,
                memory_fraction_kind="of_total",
                memory_fraction_value=gmu,
                tp_size=tp,
                gemm_quant_mode=GEMM[quant],
                kvcache_quant_mode=KV[kv],
            )
        except (ValueError, RuntimeError):
            return None
        return int(est["total_kv_size_tokens"])

    def latency(self, tp: int, quant: str, kv: str, c: int, chunk: int) -> tuple[float, float]:
        """(TTFT s, TPOT s) at a batch of ``c`` with ``chunk`` batched tokens (memoised)."""
        key = (tp, quant, kv, c, chunk)
        if key not in self._latency:
            from aiconfigurator_core.sdk.config import RuntimeConfig

            model, backend = self._model(tp, quant, kv)
            rc = RuntimeConfig(isl=self.system.load.isl, osl=self.system.load.osl, batch_size=c)
            d = backend.run_agg(model, self.db, rc, ctx_tokens=chunk).get_result_dict()
            self._latency[key] = (float(d["ttft"]) / 1e3, float(d["tpot"]) / 1e3)
        return self._latency[key]

    def _model(self, tp: int, quant: str, kv: str) -> tuple[Any, Any]:
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.config_builders import build_model_config
        from aiconfigurator_core.sdk.models import get_model

        if self._current[0] != (tp, quant, kv):
            mc = build_model_config(
                tp, 1, 1, 1, 1, gemm_quant_mode=GEMM[quant], kvcache_quant_mode=KV[kv]
            )
            backend = get_backend("vllm")
            # Its result cache is keyed without the model: a new model starts it empty.
            backend._agg_cache.clear()
            self._current = ((tp, quant, kv), (get_model(self.system.model, mc, "vllm"), backend))
        return self._current[1]


def landscape(system: System) -> GpuLandscape:
    """Every configuration of AXES, estimated and queued (seconds)."""
    est = Estimator(system)
    load, truths = system.load, {}
    for tp, quant, kv in itertools.product(
        AXES[GPU_PARAM], AXES["quantization"], AXES["kv_cache_dtype"]
    ):
        for gmu in AXES["gpu_memory_utilization"]:
            tokens = est.kv_tokens(tp, quant, kv, gmu)
            slots = 0 if tokens is None else tokens // load.tokens_per_request
            for seqs, chunk in itertools.product(
                AXES["max_num_seqs"], AXES["max_num_batched_tokens"]
            ):
                c = running(load, seqs, slots)
                key: Key = (tp, seqs, chunk, quant, kv, gmu)
                if c < 1:
                    truths[key] = measured(None, "no_kv_budget")
                    continue
                ttft, tpot = est.latency(tp, quant, kv, c, chunk)
                truths[key] = measured(serve(load, c, ttft, tpot))
    return GpuLandscape(list(AXES), truths, system.defaults)
