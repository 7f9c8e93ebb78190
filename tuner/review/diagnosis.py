"""Bottleneck diagnosis of one trial: is the GPU waiting for data, or the data for the GPU?

Two steps, both data-driven:

1. :func:`signals` turns a trial's telemetry summary (result.json ``telemetry``: ``gpu``,
   ``process``, ``metrics`` dicts) and measurements into a few named numbers, e.g.
   ``utilisation`` (mean GPU utilisation, or on CPU the server's busy cores over the cores it
   may use), ``waiting_mean`` (requests queued in vLLM), ``kv_usage_max``, ``preemptions``.
2. :data:`RULES` is the table of bottlenecks, most decisive first; each rule is a list of
   threshold checks on those signals (all must hold). The first matching rule is the trial's
   bottleneck; every matching rule is listed with the numbers that made it match.

A threshold is data: change :data:`RULES` (or pass your own table), not code.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CLIENT_SATURATED = "client_saturated"
CLIENT_LAGGING = "client_lagging"
KV_CACHE_PRESSURE = "kv_cache_pressure"
QUEUEING = "queueing"
COMPUTE_BOUND = "compute_bound"
UNDER_FED = "under_fed"
BALANCED = "balanced"  # telemetry present, no rule matched
FAILED = "failed"  # the trial produced no measurement
UNKNOWN = "unknown"  # no telemetry to judge from

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


@dataclass(frozen=True)
class Check:
    signal: str
    op: str
    threshold: float

    def holds(self, values: Mapping[str, float]) -> bool:
        value = values.get(self.signal)
        return value is not None and OPERATORS[self.op](value, self.threshold)

    def text(self, values: Mapping[str, float]) -> str:
        return f"{self.signal} {values[self.signal]:.3g} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class Rule:
    label: str
    meaning: str
    checks: tuple[Check, ...]
    any_of: bool = False  # True: one check suffices; False: all must hold

    def matches(self, values: Mapping[str, float]) -> list[str]:
        """The evidence (one line per holding check) if the rule matches, else []."""
        held = [c for c in self.checks if c.holds(values)]
        ok = bool(held) if self.any_of else len(held) == len(self.checks)
        return [c.text(values) for c in held] if ok else []


RULES: tuple[Rule, ...] = (
    Rule(
        CLIENT_SATURATED,
        "the load generator ran out of CPU: the numbers measure the client, not the server",
        (Check("client_saturated", ">=", 1.0), Check("client_busiest_cores", ">=", 0.9)),
        any_of=True,
    ),
    Rule(
        CLIENT_LAGGING,
        "tokens reached the client later than vLLM's engine made them (its mean TPOT or E2E "
        "over the engine's histograms): the latencies include time outside the engine, a "
        "client or API server short of CPU (e.g. vLLM's CPU threads on every core: give the "
        "client CPUs of its own with placement.client_cpus)",
        (Check("client_lagging", ">=", 1.0),),
    ),
    Rule(
        KV_CACHE_PRESSURE,
        "the KV cache is full: requests are preempted or wait for blocks",
        (Check("kv_usage_max", ">=", 0.95), Check("preemptions", ">", 0.0)),
        any_of=True,
    ),
    Rule(
        QUEUEING,
        "requests wait in vLLM's queue: the batch limits are below the offered load",
        (Check("waiting_mean", ">=", 1.0),),
    ),
    Rule(
        COMPUTE_BOUND,
        "the device is busy all the time: more throughput needs more or faster devices",
        (Check("utilisation", ">=", 0.90),),
    ),
    Rule(
        UNDER_FED,
        "the device idles with an empty queue: offer more load (concurrency, rate)",
        (Check("utilisation", "<", 0.50), Check("waiting_max", "<=", 0.0)),
    ),
)
RULE_MEANINGS = {r.label: r.meaning for r in RULES} | {
    BALANCED: "no single bottleneck stands out",
    FAILED: "the trial produced no measurement",
    UNKNOWN: "no telemetry was recorded",
}


@dataclass
class Diagnosis:
    bottleneck: str
    matched: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    signals: dict[str, float] = field(default_factory=dict)

    @property
    def meaning(self) -> str:
        return RULE_MEANINGS.get(self.bottleneck, "")

    def line(self) -> str:
        why = f" ({'; '.join(self.evidence)})" if self.evidence else ""
        return f"{self.bottleneck}{why}"


def _num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _utilisation(telemetry: Mapping[str, Any], cores: float) -> float | None:
    """GPU utilisation as a fraction; on CPU, the server's busy cores over usable cores."""
    gpu_util = _num((telemetry.get("gpu") or {}).get("util_mean_pct"))
    if gpu_util is not None:
        return gpu_util / 100.0
    busy = _num((telemetry.get("process") or {}).get("server_cpu_mean_cores"))
    return busy / cores if busy is not None and cores > 0 else None


def signals(telemetry: Mapping[str, Any], cores: float) -> dict[str, float]:
    """The named numbers :data:`RULES` judge, from a telemetry summary (absent: not present)."""
    metrics = telemetry.get("metrics") or {}
    process = telemetry.get("process") or {}
    raw: dict[str, Any] = {
        "client_saturated": 1.0 if telemetry.get("client_saturated") else 0.0,
        "client_busiest_cores": process.get("client_busiest_proc_cores"),
        "client_lagging": 1.0 if telemetry.get("client_lagging") else 0.0,
        "kv_usage_max": metrics.get("kv_cache_usage_max"),
        "preemptions": metrics.get("preemptions"),
        "waiting_mean": metrics.get("num_requests_waiting_mean"),
        "waiting_max": metrics.get("num_requests_waiting_max"),
        "running_mean": metrics.get("num_requests_running_mean"),
        "utilisation": _utilisation(telemetry, cores),
    }
    return {k: v for k, v in ((k, _num(v)) for k, v in raw.items()) if v is not None}


def diagnose(
    telemetry: Mapping[str, Any] | None,
    ok: bool = True,
    cores: float = 0.0,
    rules: Sequence[Rule] = RULES,
) -> Diagnosis:
    """The bottleneck of one trial from its telemetry summary.

    ``cores``: CPU cores the server may use (for the CPU utilisation signal; 0 = unknown).
    """
    if not ok:
        return Diagnosis(FAILED)
    if not telemetry or not (telemetry.get("metrics") or telemetry.get("process")):
        return Diagnosis(UNKNOWN)
    values = signals(telemetry, cores)
    found = [(r.label, ev) for r in rules if (ev := r.matches(values))]
    if not found:
        return Diagnosis(BALANCED, signals=values)
    return Diagnosis(found[0][0], [label for label, _ in found], found[0][1], values)
