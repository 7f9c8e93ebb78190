"""One configuration on one GPU system, estimated by NVIDIA's AIConfigurator (offline).

What it models of a vLLM server (measured against its own shipped vLLM runs in
``benchmarks/findings/plan-fidelity.md``): tensor and pipeline parallelism, the weight and KV-
cache precision, the concurrency (``max_num_seqs`` capped by the workload's), the prefill token
budget (``max_num_batched_tokens``) and the memory fraction. It returns steady-state means at a
full batch: no arrivals, no queueing, no tails. So an estimate screens (a configuration whose
weights or one full-length sequence cannot fit would not start) and orders candidates; it never
stands in for a measurement, and its TTFT is often a third off.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tuner.errors import ConfigError
from tuner.plan.system import BACKEND, aiconfigurator


class Fit(StrEnum):
    """Whether a configuration fits its GPUs."""

    YES = "yes"  # weights and the KV cache of the whole concurrency fit
    # vLLM starts, but its KV cache holds fewer tokens than the concurrency asks for: it queues
    # or preempts (AIConfigurator calls this OOM; vLLM completed such runs)
    KV = "kv-limited"
    NO = "no"  # the weights, or one max_model_len sequence, do not fit: vLLM would not start
    # the estimator cannot say (no kernel data for this precision on this GPU, a layout it does
    # not model): never screened, since not knowing is not a reason to skip a candidate
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PlanPoint:
    """A configuration in the estimator's terms (None precision: the checkpoint's own)."""

    tp: int = 1
    pp: int = 1
    batch: int = 1  # concurrent sequences at steady state
    ctx_tokens: int = 8192  # prefill tokens one engine step may take
    isl: int = 1024  # mean prompt tokens
    osl: int = 128  # mean output tokens
    gemm: str | None = None  # weight precision (AIConfigurator's GEMM quant mode)
    kv: str | None = None  # KV-cache precision
    memory_fraction: float = 0.9
    max_model_len: int = 0  # 0: not checked
    # MoE layers: split each expert over the TP ranks (vLLM's default), or place whole experts
    # on ranks (--enable-expert-parallel). No effect on a dense model.
    expert_parallel: bool = False

    @property
    def moe_split(self) -> tuple[int, int]:
        """(MoE tensor-parallel, expert-parallel) sizes: their product is the TP size."""
        return (1, self.tp) if self.expert_parallel else (self.tp, 1)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


NAN = math.nan


@dataclass(frozen=True)
class PointEstimate:
    """What the estimator says of one point; latencies in ms, rates per second."""

    point: PlanPoint
    fits: Fit
    note: str = ""
    kv_tokens: int | None = None  # the KV cache's capacity in tokens
    ttft_ms: float = NAN
    tpot_ms: float = NAN
    tokens_s_gpu: float = NAN  # output tokens per second per GPU
    requests_s: float = NAN  # completed requests per second of one server
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tokens_s(self) -> float:
        return self.tokens_s_gpu * self.point.gpus

    @property
    def e2e_ms(self) -> float:
        return self.ttft_ms + self.tpot_ms * max(self.point.osl - 1, 0)

    @property
    def starts(self) -> bool:
        return self.fits != Fit.NO

    def attrs(self, system: str) -> dict[str, Any]:
        """As a trial's user attrs (:data:`PLAN_ATTRS`), kept beside what was measured."""
        values = (system, self.fits.value, self.ttft_ms, self.tpot_ms, self.tokens_s_gpu)
        return {k: _json(v) for k, v in zip(PLAN_ATTRS, values, strict=True)}


# A launched trial's estimate, stored with it (study.prescreen): an estimate sits beside the
# measurement for a reader to compare (tuner.plan.fidelity), never in place of it.
PLAN_ATTRS = ("plan_system", "plan_fits", "plan_ttft_ms", "plan_tpot_ms", "plan_tok_s_gpu")


def _json(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def step_prefill(point: PlanPoint) -> int:
    """Prefill tokens per engine step at steady state: about one prompt, since arrivals spread
    out after the first wave, and never more than the token budget. Against AIConfigurator's
    shipped vLLM runs (benchmarks/plan_fidelity.py) this ranks TTFT with rho 0.97 (Llama-3.1-70B
    on an H200) where passing the whole budget (8192) gave 0.63 and TTFTs 3.5x too high."""
    return max(1, min(point.ctx_tokens, point.isl))


class Estimator:
    """AIConfigurator's vLLM model of one system and model; the database is loaded once."""

    def __init__(self, system: str, version: str, model: str) -> None:
        aiconfigurator()
        from aiconfigurator_core.sdk.perf_database import get_database_view

        self.system, self.version, self.model = system, version, model
        database = get_database_view(system, BACKEND, version)
        if database is None:
            raise ConfigError(f"AIConfigurator has no vLLM {version} data for {system}")
        self.database = database
        # AIConfigurator caches a backend's results by batch and lengths, not by model: one
        # backend per model configuration, or a TP 8 point would get TP 1's answer.
        self._models: dict[tuple[int, int, str | None, str | None, bool], tuple[Any, Any]] = {}

    @property
    def gpu_memory_gib(self) -> float:
        return float(self.database.system_spec["gpu"]["mem_capacity"]) / 2**30

    def _model(self, point: PlanPoint) -> tuple[Any, Any]:
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.config_builders import build_model_config
        from aiconfigurator_core.sdk.models import get_model

        key = (point.tp, point.pp, point.gemm, point.kv, point.expert_parallel)
        if key not in self._models:
            moe_tp, moe_ep = point.moe_split
            config = build_model_config(
                point.tp,
                point.pp,
                1,
                moe_tp,
                moe_ep,
                gemm_quant_mode=point.gemm,
                kvcache_quant_mode=point.kv,
            )
            self._models[key] = (get_model(self.model, config, BACKEND), get_backend(BACKEND))
        return self._models[key]

    def kv_tokens(self, point: PlanPoint) -> int:
        """The KV cache's tokens at the memory fraction; ValueError when nothing is left."""
        from aiconfigurator_core.sdk.memory import estimate_kv_cache

        found = estimate_kv_cache(
            self.model,
            self.system,
            BACKEND,
            self.version,
            max_num_tokens=point.ctx_tokens,
            max_batch_size=point.batch,
            memory_fraction_kind="of_total",  # vLLM's gpu_memory_utilization is of the total
            memory_fraction_value=point.memory_fraction,
            tp_size=point.tp,
            pp_size=point.pp,
            moe_tp_size=point.moe_split[0],
            moe_ep_size=point.moe_split[1],
            gemm_quant_mode=point.gemm,
            kvcache_quant_mode=point.kv,
        )
        return int(found["total_kv_size_tokens"])

    def fit(self, point: PlanPoint) -> tuple[Fit, str, int | None]:
        """Whether ``point`` fits, why not, and its KV-cache tokens."""
        try:
            tokens = self.kv_tokens(point)
        except Exception as exc:  # AIConfigurator's own errors are of many types
            # Only "no KV budget" (the weights and activations take all the memory) is a
            # verdict; any other failure is the estimator's limit, not the candidate's.
            verdict = Fit.NO if NO_KV_BUDGET in str(exc) else Fit.UNKNOWN
            return verdict, _short(exc), None
        if point.max_model_len and tokens < point.max_model_len:
            return Fit.NO, f"KV cache {tokens} tokens < max_model_len {point.max_model_len}", tokens
        need = point.batch * (point.isl + point.osl)
        if tokens < need:
            return Fit.KV, f"KV cache {tokens} tokens < {need} for {point.batch} sequences", tokens
        return Fit.YES, "", tokens

    def estimate(self, point: PlanPoint) -> PointEstimate:
        """Fit, then (when it would start) TTFT, TPOT and throughput at the full batch."""
        from aiconfigurator_core.sdk.config import RuntimeConfig

        fits, note, tokens = self.fit(point)
        if fits in (Fit.NO, Fit.UNKNOWN):
            return PointEstimate(point, fits, note, tokens)
        try:
            model, backend = self._model(point)
            runtime = RuntimeConfig(isl=point.isl, osl=point.osl, batch_size=point.batch)
            summary = backend.run_agg(model, self.database, runtime, ctx_tokens=step_prefill(point))
            result = summary.get_result_dict()
        except Exception as exc:  # e.g. PerfDataNotAvailableError: no kernel data to say
            return PointEstimate(point, Fit.UNKNOWN, _short(exc), tokens)
        return PointEstimate(
            point,
            fits,
            note,
            tokens,
            ttft_ms=float(result["ttft"]),
            tpot_ms=float(result["tpot"]),
            tokens_s_gpu=float(result["tokens/s/gpu"]),
            requests_s=float(result["seq/s"]),
            extra={"memory_gib": float(result["memory"])},
        )


NO_KV_BUDGET = "no KV budget"  # AIConfigurator's words when nothing is left for the KV cache
_BYTES_RE = re.compile(r"(\d{7,}) bytes")


def _short(exc: BaseException) -> str:
    """AIConfigurator's reason on one line, its byte counts in GiB."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = _BYTES_RE.sub(lambda m: f"{int(m.group(1)) / 2**30:.1f} GiB", text)
    return text.removeprefix("unsupported model/backend/GPU for KV-cache estimation: ")[:160]
