"""How well estimates agree with measurements: rank correlation and ratios.

An estimate screens and orders candidates; whether its order is the measured order is what
decides its worth (Spearman's rho), and the ratios say how far off its absolute values are (a
TTFT estimate a third low still orders well). Used by ``benchmarks/plan_fidelity.py`` against
AIConfigurator's shipped vLLM measurements, and for a study's own trials, whose estimates
``study.prescreen`` stores beside their measurements (:data:`tuner.plan.estimate.PLAN_ATTRS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MIN_PAIRS = 3  # fewer points have no rank order worth a number


@dataclass(frozen=True)
class Agreement:
    """Estimated against measured values of one metric over ``n`` points."""

    metric: str
    n: int
    spearman: float | None  # rank correlation; None under MIN_PAIRS or for a constant side
    ratio_median: float | None  # measured / estimated: above 1, the estimate is low
    ratio_p10: float | None
    ratio_p90: float | None
    abs_error_median: float | None  # median |estimated - measured| / measured

    def line(self) -> str:
        def show(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        return (
            f"{self.metric}: n={self.n}, Spearman rho {show(self.spearman, '.2f')}, "
            f"measured/estimated median {show(self.ratio_median, '.2f')} "
            f"(P10-P90 {show(self.ratio_p10, '.2f')}-{show(self.ratio_p90, '.2f')}), "
            f"median abs. error {show(self.abs_error_median, '.0%')}"
        )


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho (average ranks for ties); None for too few points or a constant side."""
    if len(a) < MIN_PAIRS:
        return None
    ra = pd.Series(a, dtype=float).rank().to_numpy()
    rb = pd.Series(b, dtype=float).rank().to_numpy()
    if np.std(ra) == 0 or np.std(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def estimate_vs_measured(
    estimated: Sequence[float | None], measured: Sequence[float | None], metric: str = ""
) -> Agreement:
    """Agreement of paired values; pairs with a missing, non-finite or non-positive side are
    left out (a failed trial has no measurement; a point that cannot start, no estimate)."""
    if len(estimated) != len(measured):
        raise ValueError(f"{len(estimated)} estimates for {len(measured)} measurements")
    pairs = [
        (float(e), float(m))
        for e, m in zip(estimated, measured, strict=True)
        if e is not None and m is not None and _usable(e) and _usable(m)
    ]
    est = [e for e, _ in pairs]
    meas = [m for _, m in pairs]
    ratios = np.array([m / e for e, m in pairs])
    errors = np.array([abs(e - m) / m for e, m in pairs])
    return Agreement(
        metric=metric,
        n=len(pairs),
        spearman=spearman(est, meas),
        ratio_median=_q(ratios, 50),
        ratio_p10=_q(ratios, 10),
        ratio_p90=_q(ratios, 90),
        abs_error_median=_q(errors, 50),
    )


def _usable(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0


def _q(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


# A stored trial's estimate (ms) and measurement (s): the estimate is a mean, so the mean.
TRIAL_METRICS = {
    "ttft": ("plan_ttft_ms", "m_ttft_mean_s"),
    "tpot": ("plan_tpot_ms", "m_tpot_mean_s"),
}


def trials_agreement(attrs: Sequence[Mapping[str, Any]]) -> dict[str, Agreement]:
    """Estimate against measurement over a study's trials, from their user attrs (trials
    launched with study.prescreen carry both); failed and unestimated trials drop out."""
    out = {}
    for metric, (est_key, meas_key) in TRIAL_METRICS.items():
        est = [_ms_to_s(a.get(est_key)) for a in attrs]
        meas = [a.get(meas_key) for a in attrs]
        out[metric] = estimate_vs_measured(est, meas, metric)
    return out


def _ms_to_s(value: Any) -> float:
    return float(value) / 1000 if _usable(value) else math.nan
