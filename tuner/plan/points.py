"""A study's search space as the estimator sees it: vLLM flags -> :class:`PlanPoint`, and the
points of the space to estimate (every point, or a seeded sample of a large or continuous one).

Only the flags the estimator models vary a point; the others (block size, eager mode, prefix
caching, environment variables) would give the same estimate, so the plan collapses them and
says so.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.config import ParamSpec, TunerConfig
from tuner.config.workload import WorkloadConfig
from tuner.plan.estimate import PlanPoint
from tuner.search import space as search_space
from tuner.search.resolved import resolve_params

# vLLM flag -> what it sets in the estimator's terms
MODELLED = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "quantization",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "enable_expert_parallel",
)
# vLLM's --quantization / --kv-cache-dtype values -> AIConfigurator's quant modes; a value not
# here (awq, gptq, ... a checkpoint's format) is estimated as the checkpoint's own precision.
GEMM_MODES = {"fp8": "fp8", "ptpc_fp8": "fp8", "fbgemm_fp8": "fp8", "modelopt": "fp8"}
KV_MODES = {"fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bfloat16": "bfloat16"}
DEFAULT_MEMORY_FRACTION = 0.9  # vLLM's --gpu-memory-utilization default


@dataclass(frozen=True)
class Defaults:
    """vLLM's defaults where a flag is left out (its OpenAI server, by GPU memory)."""

    max_num_seqs: int
    max_num_batched_tokens: int


def vllm_defaults(gpu_memory_gib: float, gpu: str) -> Defaults:
    """As vLLM 0.3x picks them for its OpenAI server: larger budgets from 70 GiB (not on an
    A100, where they cost throughput), larger still from 160 GiB (B200 and up)."""
    if gpu_memory_gib >= 160:
        return Defaults(1024, 16384)
    if gpu_memory_gib >= 70 and "A100" not in gpu.upper():
        return Defaults(1024, 8192)
    return Defaults(256, 2048)


def mean_lengths(workload: WorkloadConfig) -> tuple[int, int]:
    """Mean prompt and output tokens of the request mix (weighted by class)."""
    total = sum(c.weight for c in workload.classes)
    isl = sum(c.weight * c.prompt_tokens.mean for c in workload.classes) / total
    osl = sum(c.weight * c.output_tokens.mean for c in workload.classes) / total
    return max(1, round(isl)), max(1, round(osl))


def _int(value: Any, default: int) -> int:
    return default if value is None else int(value)


def point_of(config: TunerConfig, params: Mapping[str, Any], defaults: Defaults) -> PlanPoint:
    """The estimator's point for the server that ``params`` (on top of the fixed args) runs."""
    specs = search_space.flatten(config.search_space)
    known = {p: v for p, v in params.items() if p in specs}
    args = resolve_params(known, specs, config.server).flags
    isl, osl = mean_lengths(config.workload)
    seqs = _int(args.get("max_num_seqs"), defaults.max_num_seqs)
    # A closed loop never has more requests in flight than users; an open loop's steady
    # concurrency is unknown before a run, so the server's cap stands for it.
    if config.workload.mode == "closed":
        seqs = min(seqs, config.workload.concurrency)
    quant, kv = args.get("quantization"), args.get("kv_cache_dtype")
    return PlanPoint(
        tp=_int(args.get("tensor_parallel_size"), 1),
        pp=_int(args.get("pipeline_parallel_size"), 1),
        batch=max(1, seqs),
        ctx_tokens=_int(args.get("max_num_batched_tokens"), defaults.max_num_batched_tokens),
        isl=isl,
        osl=osl,
        gemm=GEMM_MODES.get(str(quant)) if quant is not None else None,
        kv=KV_MODES.get(str(kv)) if kv is not None else None,
        memory_fraction=float(args.get("gpu_memory_utilization") or DEFAULT_MEMORY_FRACTION),
        max_model_len=_int(args.get("max_model_len"), 0),
        expert_parallel=bool(args.get("enable_expert_parallel")),
    )


def range_values(spec: ParamSpec, count: int) -> list[Any]:
    """``count`` values along a range: geometric on a log scale, on its step when it has one."""
    low, high = float(spec.low or 0), float(spec.high or 0)
    if spec.log:
        raw = [low * (high / low) ** (i / (count - 1)) for i in range(count)]
    else:
        raw = [low + (high - low) * i / (count - 1) for i in range(count)]
    if spec.step:
        raw = [low + round((v - low) / spec.step) * spec.step for v in raw]
    if spec.type == "int":
        return sorted({round(v) for v in raw})
    return sorted({round(v, 4) for v in raw})


def param_values(spec: ParamSpec, count: int) -> list[Any]:
    choices = search_space.choices_of(spec)
    return list(choices) if choices is not None else range_values(spec, count)


def modelled(specs: Mapping[str, ParamSpec]) -> tuple[dict[str, ParamSpec], list[str]]:
    """The params that change an estimate, and the names of those that do not."""
    kept = {p: s for p, s in specs.items() if s.target == "arg" and (s.name or p) in MODELLED}
    return kept, [p for p in specs if p not in kept]


def grid(
    specs: Mapping[str, ParamSpec], count: int, max_points: int, seed: int
) -> tuple[list[dict[str, Any]], int]:
    """The points of ``specs`` (``count`` values per range) and how many there are in all;
    beyond ``max_points``, a seeded sample of them in the space's own order."""
    names = list(specs)
    axes = [param_values(specs[p], count) for p in names]
    total = math.prod(len(a) for a in axes) if axes else 1
    if total <= max_points:
        chosen = list(range(total))
    else:
        chosen = sorted(random.Random(seed).sample(range(total), max_points))
    points = [_nth(axes, i) for i in chosen]
    return [dict(zip(names, p, strict=True)) for p in points], total


def _nth(axes: list[list[Any]], index: int) -> tuple[Any, ...]:
    """The ``index``-th point of the product of ``axes`` (last axis fastest), without
    building the product: a space of 10^6 points is sampled as cheaply as one of 10."""
    out = []
    for axis in reversed(axes):
        index, pos = divmod(index, len(axis))
        out.append(axis[pos])
    return tuple(reversed(out))


def study_specs(config: TunerConfig) -> dict[str, ParamSpec]:
    """Every param of the study's stages (the whole space the study may run)."""
    return {
        p: s for name in config.study.stages for p, s in config.search_space.get(name, {}).items()
    }
