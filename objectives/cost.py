"""Cost per million output tokens, from list prices in the ``cost`` config group.

cost = price_per_hour / (output tok/s x 3600) x 1e6, where price_per_hour is
``cost.gpu_hour[model] x gpus_used`` on cuda and ``cost.cpu_hour x cpus`` on cpu.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from tuner import (
    MINIMIZE,
    ConfigError,
    Measurements,
    Objective,
    ObjectiveContext,
    has_traffic,
    register_objective,
)

SECONDS_PER_HOUR = 3600.0
PER_MILLION = 1e6


def gpu_price_key(prices: dict[str, float], model: str) -> str | None:
    """The price key for a GPU model name: exact, else a whole word of NVML's name.

    NVML says "NVIDIA H100 80GB HBM3" or "NVIDIA A100-SXM4-80GB"; matching whole words (not
    substrings) keeps "A10" from pricing an "A100".
    """
    if model in prices:
        return model
    words = {w.upper() for w in re.split(r"[\s\-_]+", model) if w}
    matches = [key for key in prices if key.upper() in words]
    return max(matches, key=len) if matches else None


def _gpu_price(ctx: ObjectiveContext) -> float:
    model = ctx.cost.gpu_model or ctx.gpu_model
    key = gpu_price_key(ctx.cost.gpu_hour, model)
    if key is None:
        known = ", ".join(sorted(ctx.cost.gpu_hour)) or "none"
        raise ConfigError(
            f"no price for GPU model {model!r} in cost.gpu_hour (known: {known})",
            hint=f"add cost.gpu_hour.{model or '<MODEL>'}=<USD per GPU-hour> or set cost.gpu_model",
        )
    if ctx.gpus_used < 1:
        raise ConfigError(f"cost on cuda needs gpus_used >= 1, got {ctx.gpus_used}")
    return ctx.cost.gpu_hour[key] * ctx.gpus_used


def _cpu_price(ctx: ObjectiveContext) -> float:
    return ctx.cost.cpu_hour * ctx.billed_cpus


# How each device is billed; a new device kind adds an entry here, not a branch.
PRICING: dict[str, Callable[[ObjectiveContext], float]] = {"cuda": _gpu_price, "cpu": _cpu_price}


def price_per_hour(ctx: ObjectiveContext) -> float:
    """USD per hour of the hardware one trial's server occupies."""
    try:
        pricing = PRICING[ctx.device]
    except KeyError:
        raise ConfigError(
            f"no pricing for device {ctx.device!r} (known: {sorted(PRICING)})"
        ) from None
    return pricing(ctx)


def cost_per_million_tokens(price_hour: float, output_tok_s: float) -> float:
    if output_tok_s <= 0:
        return math.inf  # nothing produced: infinitely expensive, never "free"
    return price_hour / (output_tok_s * SECONDS_PER_HOUR) * PER_MILLION


@register_objective
class CostPerMillionTokens(Objective):
    name = "cost_per_million_tokens"
    direction = MINIMIZE
    unit = "$"
    description = "USD per 1M output tokens at the configured hourly prices"

    def validate(self, ctx: ObjectiveContext) -> None:
        price_per_hour(ctx)  # a missing price is a set-up error, not a NaN per trial

    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        if not has_traffic(m):
            return math.nan
        return cost_per_million_tokens(price_per_hour(ctx), m.output_throughput)
