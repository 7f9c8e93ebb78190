"""What a simulated GPU host computes with: AIConfigurator's estimates for one launch.

The simulated host takes vLLM's own flags; this module turns them into the estimator's terms
(tensor and pipeline size, weight and KV precision, memory fraction, token budget) and asks
AIConfigurator once, at start-up, for the memory fit, the KV cache's capacity and the TTFT and
TPOT at a grid of running batches. Serving then interpolates that table, so a step costs no
estimate. The numbers are steady-state means at a reference prompt and output length: the host
scales prefill by each request's own prompt length and lets queueing happen for real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.plan.estimate import Estimator, Fit, PlanPoint, PointEstimate
from tuner.plan.system import backend_version, resolve_model

# vLLM's defaults on a GPU of 80 GB or more, for a flag the launch leaves out (vLLM's own
# config builder picks these for the OpenAI server; tuner.study.state.params_as_run says why it
# matters).
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_BATCHED_TOKENS = 8192
DEFAULT_MEMORY_FRACTION = 0.9
REFERENCE_ISL = 1024  # the prompt length prefill is estimated at (and at twice it)
# Loading weights from a local NVMe and capturing CUDA graphs: a 8B model is ready in about a
# minute, a 70B in a few; the simulated host sleeps this (times its start-up scale).
LOAD_GIB_PER_S = 2.0
GRAPH_CAPTURE_S = 30.0
_PRECISIONS = {"fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "auto": None, None: None}


@dataclass(frozen=True)
class Launch:
    """The flags of one launch that the physics depends on, as vLLM's parser read them."""

    model: str
    tp: int = 1
    pp: int = 1
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS
    gpu_memory_utilization: float = DEFAULT_MEMORY_FRACTION
    max_model_len: int = 0
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool = True

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @classmethod
    def from_parsed(cls, values: dict[str, Any]) -> Launch:
        """From vLLM's parsed namespace (dest -> value); a None keeps vLLM's default."""

        def pick(name: str, default: Any) -> Any:
            value = values.get(name)
            return default if value is None else value

        return cls(
            model=str(values["model"]),
            tp=int(pick("tensor_parallel_size", 1)),
            pp=int(pick("pipeline_parallel_size", 1)),
            max_num_seqs=int(pick("max_num_seqs", DEFAULT_MAX_NUM_SEQS)),
            max_num_batched_tokens=int(pick("max_num_batched_tokens", DEFAULT_BATCHED_TOKENS)),
            gpu_memory_utilization=float(pick("gpu_memory_utilization", DEFAULT_MEMORY_FRACTION)),
            max_model_len=int(pick("max_model_len", 0)),
            quantization=values.get("quantization"),
            kv_cache_dtype=values.get("kv_cache_dtype"),
            enable_prefix_caching=bool(pick("enable_prefix_caching", True)),
        )


@dataclass(frozen=True)
class Physics:
    """The estimated behaviour of one launch: memory, prefill cost, decode step by batch."""

    system: str
    launch: Launch
    kv_tokens: int
    weights_gib: float
    prefill_overhead_s: float  # what an engine step that prefills pays once
    prefill_token_s: float  # and per prompt token
    batches: tuple[int, ...]
    tpot_s: tuple[float, ...]  # one decode step at each running batch
    # This launch's slowdown (tuner.simulation.launch_noise): real GPUs differ launch to launch.
    # Exactly 1 leaves every duration as estimated, bit for bit.
    launch_factor: float = 1.0

    def step_s(self, running: int) -> float:
        """One decode step of ``running`` sequences."""
        step = float(np.interp(max(running, 1), self.batches, self.tpot_s))
        return step * self.launch_factor

    def prefill_s(self, tokens: int) -> float:
        """Prefill of ``tokens`` prompt tokens in one step (none: nothing)."""
        if tokens <= 0:
            return 0.0
        return (self.prefill_overhead_s + tokens * self.prefill_token_s) * self.launch_factor

    @property
    def startup_s(self) -> float:
        """How long the real server would take to load and capture graphs on its GPUs."""
        return GRAPH_CAPTURE_S + self.weights_gib / LOAD_GIB_PER_S


class DoesNotFit(Exception):
    """The launch cannot start on its GPUs: vLLM's start-up would fail the same way."""


class CannotEstimate(Exception):
    """AIConfigurator has no data to say how the launch runs (a precision on this GPU, a
    layout it does not model): not a reason to call it out of memory."""


def precision(name: str | None) -> str | None:
    """AIConfigurator's quant mode for a vLLM precision flag (None: the checkpoint's own)."""
    if name not in _PRECISIONS:
        raise ConfigError(
            f"the simulated GPU host does not model precision {name!r}",
            hint="use fp8, or leave the flag out (the checkpoint's own precision)",
        )
    return _PRECISIONS[name]


def batch_grid(max_num_seqs: int) -> tuple[int, ...]:
    """Powers of two up to ``max_num_seqs``, and it: the table is interpolated between them."""
    grid = [2**i for i in range(int(math.log2(max(max_num_seqs, 1))) + 1)]
    return tuple(sorted({*grid, max_num_seqs}))


def point_of(launch: Launch, batch: int, isl: int = REFERENCE_ISL, osl: int = 2) -> PlanPoint:
    return PlanPoint(
        tp=launch.tp,
        pp=launch.pp,
        batch=batch,
        ctx_tokens=launch.max_num_batched_tokens,
        isl=isl,
        osl=osl,
        gemm=precision(launch.quantization),
        kv=precision(launch.kv_cache_dtype),
        memory_fraction=launch.gpu_memory_utilization,
        max_model_len=launch.max_model_len,
    )


def estimate(system: str, launch: Launch, version: str = "") -> Physics:
    """Ask AIConfigurator about ``launch`` on ``system``; DoesNotFit where vLLM would not start,
    CannotEstimate where AIConfigurator cannot say.

    Its aggregated TTFT and TPOT at a batch already hold queueing and the prefill steps mixed
    into decoding; the engine does both for real, so the costs it needs come from where they
    are alone: prefill from one request at two prompt lengths (the slope per token, the rest a
    step's overhead), a decode step from an output long enough to dilute the prefill steps.
    """
    estimator = Estimator(system, backend_version(system, version), resolve_model(launch.model))
    fits, note, tokens = estimator.fit(point_of(launch, 1))
    if fits == Fit.NO:
        raise DoesNotFit(note or "the weights leave no memory for the KV cache")
    if fits == Fit.UNKNOWN or tokens is None:
        raise CannotEstimate(note)
    short, long = (_estimated(estimator, point_of(launch, 1, isl)).ttft_ms for isl in (1024, 2048))
    per_token = max(long - short, 0.0) / 1024 / 1000
    batches, tpot = [], []
    for batch in batch_grid(launch.max_num_seqs):
        found = estimator.estimate(point_of(launch, batch, osl=max(2048, 32 * batch)))
        if not math.isfinite(found.tpot_ms):
            break  # past what the estimator knows: the last known step stands for larger ones
        batches.append(batch)
        tpot.append(found.tpot_ms / 1000)
    if not batches:
        raise CannotEstimate(f"no decode estimate for {launch.model} on {system}")
    return Physics(
        system=system,
        launch=launch,
        kv_tokens=tokens,
        weights_gib=weights_gib(estimator, point_of(launch, 1)),
        prefill_overhead_s=max(short / 1000 - per_token * 1024, 0.0),
        prefill_token_s=per_token,
        batches=tuple(batches),
        tpot_s=tuple(tpot),
    )


def _estimated(estimator: Estimator, point: PlanPoint) -> PointEstimate:
    found = estimator.estimate(point)
    if not math.isfinite(found.ttft_ms):
        raise CannotEstimate(found.note or f"no prefill estimate at {point}")
    return found


def weights_gib(estimator: Estimator, point: PlanPoint) -> float:
    """The weights one server loads (all its GPUs), by AIConfigurator's memory breakdown."""
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    found = estimate_kv_cache(
        estimator.model,
        estimator.system,
        "vllm",
        estimator.version,
        max_num_tokens=point.ctx_tokens,
        max_batch_size=point.batch,
        memory_fraction_kind="of_total",
        memory_fraction_value=point.memory_fraction,
        tp_size=point.tp,
        pp_size=point.pp,
        gemm_quant_mode=point.gemm,
        kvcache_quant_mode=point.kv,
    )
    per_gpu = float((found.get("memory_breakdown") or {}).get("weights_bytes", 0))
    return per_gpu * point.gpus / 2**30
