"""The plan as a table (terminal and CSV) and a figure (PNG)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner.config import SloConfig
from tuner.errors import ArtifactError
from tuner.plan.estimate import Fit, PointEstimate

SHOWN_ROWS = 30  # the terminal shows the best rows; the CSV has every one
SECONDS_PER_HOUR = 3600.0


# How steep a fitted scale may be: steeper than this from two noisy windows is noise.
MAX_SLOPE = 1.0
# A P99 TTFT measured over AIConfigurator's estimated mean grows with the batch as about
# batch**0.27: the median slope over the 64 groups of its shipped vLLM runs (system, model,
# precision, TP, lengths) that the silicon replays do not search (B200, Qwen3, gpt-oss, ...;
# quartiles 0.21-0.34; benchmarks.plan_fidelity). The estimate is a mean of a static batch;
# a closed loop's first tokens queue behind each other's prefills, more often with more users.
TTFT_SLOPE = 0.27


@dataclass(frozen=True)
class Scale:
    """Measured P99 over estimated mean as a power of the batch: ``factor * (batch / at) **
    slope``. Points measured at two batches or more say how the factor moves (a least-squares
    line in log-log); at one batch, ``prior`` does."""

    factor: float = 1.0
    slope: float = 0.0
    at: float = 1.0
    measured: int = 0  # how many measured points it was fitted on (0: none, a factor of 1)

    def __call__(self, batch: float) -> float:
        return self.factor * (max(batch, 1.0) / self.at) ** self.slope

    @classmethod
    def fit(cls, samples: Sequence[tuple[float, float]], prior: float = 0.0) -> Scale:
        """The line through (log batch, log factor) of the measured points, its slope within
        :data:`MAX_SLOPE` (a single batch: its mean factor and the ``prior`` slope)."""
        if not samples:
            return cls()
        x = np.log([max(b, 1.0) for b, _ in samples])
        y = np.log([f for _, f in samples])
        slope = prior
        if np.ptp(x) > 0:
            slope = float(np.clip(np.polyfit(x, y, 1)[0], -MAX_SLOPE, MAX_SLOPE))
        return cls(float(np.exp(y.mean())), slope, float(np.exp(x.mean())), len(samples))


@dataclass(frozen=True)
class Anchor:
    """Measured P99 over estimated mean at the points the study has measured, per latency. The
    estimator ranks well but its absolute TTFT is often a third off, and off the same way for
    the neighbours a stage tries around its incumbent; scaled so, an estimate reads as the P99
    a window would measure. The default scales by 1: no anchor."""

    ttft: Scale = Scale()
    tpot: Scale = Scale()
    e2e: Scale = Scale()

    def covers(self, slo: SloConfig) -> bool:
        """Every latency with an SLO is scaled by a measurement. An estimated mean TTFT is
        often half a measured P99: unanchored, it says points meet an SLO that none does."""
        pairs = (
            (slo.p99_ttft_s, self.ttft),
            (slo.p99_tpot_s, self.tpot),
            (slo.p99_e2e_s, self.e2e),
        )
        return all(scale.measured > 0 for limit, scale in pairs if limit > 0)


@dataclass(frozen=True)
class PlannedPoint:
    """A point of the study's space with its estimate, its cost and its SLO verdict."""

    params: dict[str, Any]
    estimate: PointEstimate
    price_per_hour: float  # one server's, NaN without a price

    @property
    def cost_per_million(self) -> float:
        """USD per million output tokens at the estimated rate (objectives/cost.py's formula)."""
        tokens = self.estimate.tokens_s
        if not math.isfinite(tokens) or tokens <= 0:
            return math.nan
        return self.price_per_hour / (tokens * SECONDS_PER_HOUR) * 1e6

    def meets(self, slo: SloConfig) -> bool:
        """Whether the estimated means are within the P99 SLOs (lenient: a mean is not a
        P99, so this only rules out what cannot meet them)."""
        return self.overshoot(slo) == 0

    def overshoot(self, slo: SloConfig, anchor: Anchor = Anchor()) -> float:
        """How far the estimated means (times ``anchor``) miss the P99 SLOs: the sum of each
        one's overshoot relative to its limit (0 when they meet them; inf without an estimate).
        The acceptance rule weighs what a measurement misses the same way, so a study that no
        point's estimate says is feasible starts nearest to feasible."""
        e = self.estimate
        if not e.starts or math.isnan(e.ttft_ms):
            return math.inf
        batch = e.point.batch
        limits = (
            (slo.p99_ttft_s, e.ttft_ms * anchor.ttft(batch)),
            (slo.p99_tpot_s, e.tpot_ms * anchor.tpot(batch)),
            (slo.p99_e2e_s, e.e2e_ms * anchor.e2e(batch)),
        )
        return sum(max(0.0, value / 1000 / limit - 1) for limit, value in limits if limit > 0)


def frame(points: Sequence[PlannedPoint], slo: SloConfig) -> pd.DataFrame:
    """One row per point: its params, then fit, KV tokens, TTFT, TPOT, rates, cost, SLO."""
    rows = []
    for p in points:
        e = p.estimate
        rows.append(
            {
                **p.params,
                "gpus": e.point.gpus,
                "batch": e.point.batch,
                "fits": e.fits.value,
                "kv_tokens": e.kv_tokens,
                "ttft_ms": e.ttft_ms,
                "tpot_ms": e.tpot_ms,
                "tok_s_gpu": e.tokens_s_gpu,
                "req_s": e.requests_s,
                "usd_per_mtok": p.cost_per_million,
                "meets_slo": p.meets(slo),
                "note": e.note,
            }
        )
    return pd.DataFrame(rows)


def ranked(table: pd.DataFrame) -> pd.DataFrame:
    """Points that start first, cheapest per token (else fastest per GPU), then the rest."""
    by_cost = table["usd_per_mtok"].notna().any()
    key = "usd_per_mtok" if by_cost else "tok_s_gpu"
    starts = table[table["fits"] != Fit.NO.value].sort_values(key, ascending=by_cost)
    return pd.concat([starts, table[table["fits"] == Fit.NO.value]])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


# Short column names for the terminal (the CSV keeps vLLM's flag names).
SHORT = {
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "quantization": "quant",
    "kv_cache_dtype": "kv",
    "gpu_memory_utilization": "gpu_mem",
    "max_num_batched_tokens": "batched_tok",
    "max_num_seqs": "max_seqs",
    "tok_s_gpu": "tok/s/gpu",
    "req_s": "req/s",
    "usd_per_mtok": "$/Mtok",
    "meets_slo": "slo",
}


def text(table: pd.DataFrame, params: Sequence[str]) -> str:
    """The terminal view: the best rows that start, and the ones that do not, grouped."""
    starts = table[table["fits"] != Fit.NO.value]
    cols = [
        *params,
        "batch",
        "fits",
        "ttft_ms",
        "tpot_ms",
        "tok_s_gpu",
        "req_s",
        "usd_per_mtok",
        "meets_slo",
    ]
    shown = starts.head(SHOWN_ROWS)[cols].map(_fmt).rename(columns=SHORT)
    lines = [shown.to_string(index=False)] if len(shown) else ["(no point would start)"]
    if len(starts) > SHOWN_ROWS:
        lines.append(f"... {len(starts) - SHOWN_ROWS} more that start (all in plan.csv)")
    lines += _not_fitting(table[table["fits"] == Fit.NO.value], params)
    return "\n".join(lines)


def _not_fitting(rows: pd.DataFrame, params: Sequence[str]) -> list[str]:
    """One line per group of points that cannot start, by the params that decide memory."""
    if rows.empty:
        return []
    memory = [
        p
        for p in params
        if p in ("tensor_parallel_size", "pipeline_parallel_size", "quantization", "kv_cache_dtype")
    ]
    lines = ["does not fit (vLLM would not start):"]
    groups = rows.groupby(memory, dropna=False, sort=True) if memory else [((), rows)]
    for values, group in groups:
        values = values if isinstance(values, tuple) else (values,)
        where = " ".join(f"{p}={v}" for p, v in zip(memory, values, strict=True)) or "every point"
        lines.append(f"  {where}: {len(group)} points ({group['note'].iloc[0]})")
    return lines


def write_csv(table: pd.DataFrame, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}") from exc


def write_png(table: pd.DataFrame, path: Path, title: str) -> None:
    """TPOT against output tokens/s per GPU, one colour per GPU count; kv-limited hollow."""
    import matplotlib

    matplotlib.use("Agg")  # no display: plans are made on servers and in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    starts = table[table["fits"] != Fit.NO.value]
    for gpus, group in starts.groupby("gpus"):
        full = group[group["fits"] == Fit.YES.value]
        limited = group[group["fits"] == Fit.KV.value]
        dot = ax.scatter(full["tpot_ms"], full["tok_s_gpu"], s=22, label=f"{gpus} GPU(s)")
        ax.scatter(
            limited["tpot_ms"],
            limited["tok_s_gpu"],
            s=22,
            facecolors="none",
            edgecolors=dot.get_facecolor(),
        )
    ax.set_xlabel("estimated TPOT (ms)")
    ax.set_ylabel("estimated output tokens/s per GPU")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if len(starts):
        ax.legend(title="hollow: KV-limited", fontsize=8)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
