"""What one measurement window says about the server: :class:`Measurements` and its
:class:`MetricStats`, as stored (``to_dict`` / ``from_dict``) and read back in tables.

They are computed from the raw records by :func:`tuner.measurement.stats.measure`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from tuner.measurement.records import ERROR_KINDS

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
STAT_NAMES = ("mean", "p50", "p90", "p95", "p99", "min", "max")
# What a request class's flat view holds: the tail the SLOs speak of, not every statistic, so
# a workload of several classes does not multiply the storage's columns by the full set.
CLASS_LATENCY_METRICS = ("ttft", "tpot", "e2e")
CLASS_STAT_NAMES = ("p50", "p95", "p99")


@dataclass
class MetricStats:
    """Summary of one latency sample, in seconds; every statistic is None when ``n == 0``."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> MetricStats:
        arr = np.asarray(values, dtype=float)
        if arr.size == 0:
            return cls()
        p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
        return cls(
            n=int(arr.size),
            mean=float(arr.mean()),
            p50=float(p50),
            p90=float(p90),
            p95=float(p95),
            p99=float(p99),
            min=float(arr.min()),
            max=float(arr.max()),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricStats:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ClassStats:
    """One request class's share of a window: the requests of that class sent in it.

    Rates are over the whole window, so the classes' throughputs add up to the totals."""

    ttft: MetricStats
    tpot: MetricStats
    e2e: MetricStats
    requests_started: int
    completed: int
    failed: int
    error_rate: float
    output_throughput: float  # output tok/s of this class's completed requests
    goodput: float  # req/s of this class that met every set SLO
    # Requests too long for the server's context (records.ERROR_REJECTED), apart from the
    # failures; their rate is of the requests started. 0 in a result.json written before.
    rejected: int = 0
    rejected_rate: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassStats:
        values = dict(data)
        for name in CLASS_LATENCY_METRICS:
            values[name] = MetricStats.from_dict(values.get(name) or {})
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def flat(self) -> dict[str, float]:
        """``name_unit -> float`` as :meth:`Measurements.flat` names them; NaN = no data."""
        out: dict[str, float] = {}
        for name in CLASS_LATENCY_METRICS:
            stats: MetricStats = getattr(self, name)
            out[f"{name}_n"] = float(stats.n)
            for stat in CLASS_STAT_NAMES:
                out[f"{name}_{stat}_s"] = _nan_if_none(getattr(stats, stat))
        out.update(
            requests_started=float(self.requests_started),
            completed=float(self.completed),
            failed=float(self.failed),
            error_rate=self.error_rate,
            output_throughput_tok_s=self.output_throughput,
            goodput_req_s=self.goodput,
            rejected=float(self.rejected),
            rejected_rate=self.rejected_rate,
        )
        return out


@dataclass
class Measurements:
    """Everything one measurement window says about the server under a workload."""

    ttft: MetricStats
    tpot: MetricStats
    itl: MetricStats
    e2e: MetricStats
    window_s: float
    requests_started: int
    completed: int
    failed: int  # the server's (and the client's) errors; not the rejected requests
    errors_by_kind: dict[str, int]
    error_rate: float  # failed / the requests the server accepted (started - rejected)
    request_throughput: float  # completed req/s
    output_throughput: float  # output tok/s of completed requests
    total_throughput: float  # (prompt + output) tok/s of completed requests
    goodput: float  # req/s that met every set SLO
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    dispatch_lag_p99_s: float | None
    # Stricter E2E P99 where each failure counts as the request timeout (AIPerf's adj_*).
    e2e_p99_adjusted_s: float | None = None
    # Output tokens *generated inside the window* per second, by any request (from each token
    # event's instant): the server's rate, free of the request-boundary steps of
    # output_throughput when the window holds few request latencies. None without token times.
    output_token_rate: float | None = None
    # The token rate in WINDOW_SLICES (stats) equal consecutive parts of the window: how much of the
    # noise is inside one launch (tuner.study.decision.noise.NoiseSplit). Empty without token times.
    window_slices: list[float] = field(default_factory=list)
    # Requests sent later than scheduled by more than stats.DISPATCH_LAG_WARN_S (an open loop or a
    # trace replay): the client, not the server, set their arrival.
    late_sends: int = 0
    # Requests refused as too long for the server's context (its max_model_len: a tier cap),
    # never clipped to fit: neither latency samples nor errors (records.ERROR_REJECTED). The
    # rate is of the requests started; slo.max_rejected_rate bounds it.
    rejected: int = 0
    rejected_rate: float = 0.0
    warnings: list[str] = field(default_factory=list)
    # The load generator behind this window: its processes and the token events per second
    # they read (set by the trial; 0 where unknown). A window whose client could not keep up
    # is measured again with more processes and never scored (tuner.loadgen.client_capacity).
    client_processes: int = 0
    client_events_s: float | None = None
    # The same window split by each record's request_class (stats.measure); empty in a
    # result.json written before classes were measured.
    by_class: dict[str, ClassStats] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (None for missing statistics, never NaN)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurements:
        values = dict(data)
        for name in LATENCY_METRICS:
            values[name] = MetricStats.from_dict(values[name])
        values["errors_by_kind"] = dict(values.get("errors_by_kind", {}))
        values["warnings"] = list(values.get("warnings", []))
        classes = values.get("by_class") or {}
        values["by_class"] = {name: ClassStats.from_dict(c) for name, c in classes.items()}
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def flat(self) -> dict[str, float]:
        """One level of ``name_unit -> float`` for tables and Optuna user attrs; NaN = no data."""
        out: dict[str, float] = {}
        for name in LATENCY_METRICS:
            stats: MetricStats = getattr(self, name)
            out[f"{name}_n"] = float(stats.n)
            for stat in STAT_NAMES:
                out[f"{name}_{stat}_s"] = _nan_if_none(getattr(stats, stat))
        out.update(
            window_s=self.window_s,
            requests_started=float(self.requests_started),
            completed=float(self.completed),
            failed=float(self.failed),
            error_rate=self.error_rate,
            request_throughput_req_s=self.request_throughput,
            output_throughput_tok_s=self.output_throughput,
            total_throughput_tok_s=self.total_throughput,
            goodput_req_s=self.goodput,
            mean_prompt_tokens=_nan_if_none(self.mean_prompt_tokens),
            mean_output_tokens=_nan_if_none(self.mean_output_tokens),
            dispatch_lag_p99_s=_nan_if_none(self.dispatch_lag_p99_s),
            e2e_p99_adjusted_s=_nan_if_none(self.e2e_p99_adjusted_s),
            output_token_rate_tok_s=_nan_if_none(self.output_token_rate),
            late_sends=float(self.late_sends),
            rejected=float(self.rejected),
            rejected_rate=self.rejected_rate,
        )
        # Every known kind always appears, so tables of several trials share their columns.
        for kind in sorted(set(ERROR_KINDS) | set(self.errors_by_kind)):
            out[f"errors_{kind}"] = float(self.errors_by_kind.get(kind, 0))
        return out

    def class_flat(self) -> dict[str, dict[str, float]]:
        """:meth:`ClassStats.flat` of each request class; kept apart from :meth:`flat` so the
        totals' columns stay the same for every workload."""
        return {name: stats.flat() for name, stats in self.by_class.items()}

    def table(self) -> pd.DataFrame:
        """Latency summary for printing: rows ttft/tpot/itl/e2e, columns mean p50 p90 p95 p99 n."""
        rows = {name: getattr(self, name) for name in LATENCY_METRICS}
        cols = ["mean", "p50", "p90", "p95", "p99"]
        frame = pd.DataFrame(
            {c: [_nan_if_none(getattr(s, c)) for s in rows.values()] for c in cols},
            index=list(rows),
        )
        frame["n"] = [s.n for s in rows.values()]
        return frame


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
