"""The baseline must fit: a study whose fixed args cannot start on their GPUs stops before its
first launch, with the smallest tensor-parallel size (and precision) the estimator says fits.

A GPU study's baseline is its longest launch (a 70B loads for minutes) and every stage is
measured against it; one that cannot load would end the study after that wait, with vLLM's
out-of-memory error and no hint of the size that works.
"""

from __future__ import annotations

from dataclasses import replace

from tuner.errors import ConfigError
from tuner.plan.demand import too_many_gpus
from tuner.plan.estimate import Fit, PlanPoint
from tuner.plan.planner import Planner

FP8 = "fp8"  # the precision a user tries next: vLLM quantizes bf16 weights to it on load
MAX_TP_UNKNOWN_HOST = 8  # TP sizes tried when the host's GPUs are not known: one 8-GPU node


def _precision(point: PlanPoint) -> str:
    return "its own precision" if point.gemm is None else f"{point.gemm} weights"


def _tp_sizes(pp: int, host: int) -> list[int]:
    """Powers of two for TP (what vLLM's attention heads divide by), within the host."""
    limit = (host // pp) if host else MAX_TP_UNKNOWN_HOST
    return [2**i for i in range(8) if 2**i <= limit]


def smallest_fit(planner: Planner, point: PlanPoint, host: int) -> list[PlanPoint]:
    """The smallest TP that fits at the point's precision, and at FP8 weights when that fits
    at a smaller TP (or the point's own precision fits at none): the ways to a baseline."""
    found: list[PlanPoint] = []
    precisions = [point.gemm] + ([FP8] if point.gemm != FP8 else [])
    for gemm in precisions:
        for tp in _tp_sizes(point.pp, host):
            candidate = replace(point, tp=tp, gemm=gemm)
            if planner.estimator.fit(candidate)[0] in (Fit.YES, Fit.KV):
                if not found or tp < found[0].tp:
                    found.append(candidate)
                break
    return found


def _way(point: PlanPoint, baseline: PlanPoint) -> str:
    if point.gemm != baseline.gemm:
        return f"tensor_parallel_size={point.tp} with quantization={point.gemm}"
    return f"tensor_parallel_size={point.tp} ({_precision(point)})"


def baseline_fit(planner: Planner, host_gpus: int = 0) -> None:
    """ConfigError (one line, exit 2) when the study's fixed args would not start on their GPUs
    by the estimator (its memory model, or more GPUs than the host has); silent when they fit
    or when the estimator cannot say."""
    estimate = planner.estimate({})
    point = estimate.point
    host = host_gpus or planner.host_gpus
    why = too_many_gpus(point.gpus, host) or (estimate.note if estimate.fits == Fit.NO else None)
    if why is None:
        return
    ways = smallest_fit(planner, point, host)
    name = planner.source.shown
    where = f"{name} at tensor_parallel_size={point.tp} ({_precision(point)}) on {planner.system}"
    if not ways:
        raise ConfigError(
            f"the baseline cannot start: {where}: {why}; no TP up to "
            f"{max(_tp_sizes(point.pp, host))} fits, at this precision or FP8",
            hint="add GPUs (pipeline_parallel_size) or a smaller model; nothing was launched",
        )
    fits = ", or ".join(_way(w, point) for w in ways)
    first = ways[0]
    setting = f"server.args.tensor_parallel_size={first.tp}"
    if first.gemm != point.gemm:
        setting += f" server.args.quantization={first.gemm}"
    raise ConfigError(
        f"the baseline cannot start: {where}: {why}; the smallest the plan says fits: {fits}",
        hint=f"set {setting}; nothing was launched",
    )
