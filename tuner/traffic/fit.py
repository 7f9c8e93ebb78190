"""A compact, editable workload fitted to real traffic, and how close it is to its source.

Lengths become empirical quantiles (the lengths at evenly spaced probabilities, drawn by
inverse-CDF interpolation); arrivals become a rate and a gamma shape (burstiness = 1/CV² of the
inter-arrival gaps, so a Poisson source fits shape 1). The fidelity check draws from the written
config as the load generator would and compares: the KS distance of each length distribution
and the arrival CV of source and fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tuner.config.workload import LengthDist, PrefixConfig, RequestClass, WorkloadConfig
from tuner.traffic.trace import Trace

QUANTILES = 101  # lengths at p = 0, 0.01, ..., 1: KS error of the interpolation <= 0.01
FIDELITY_DRAWS = 20_000
# A gamma shape below this makes gaps so skewed that a short window holds almost no arrivals.
MIN_BURSTINESS = 0.001
_STREAM_FIDELITY = 21


def empirical_draws(quantiles: list[float], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths by inverse-CDF interpolation between evenly spaced quantiles."""
    q = np.asarray(quantiles, dtype=float)
    return np.interp(rng.random(n), np.linspace(0.0, 1.0, len(q)), q)


def empirical(values: np.ndarray, n_quantiles: int = QUANTILES) -> LengthDist:
    """The empirical length distribution of ``values`` as ``n_quantiles`` quantiles."""
    q = np.quantile(values, np.linspace(0.0, 1.0, n_quantiles), method="inverted_cdf")
    return from_quantiles([float(v) for v in q], float(np.mean(values)))


def from_quantiles(quantiles: list[float], mean: float) -> LengthDist:
    low, high = math.floor(quantiles[0]), math.ceil(quantiles[-1])
    mean = min(max(mean, low), high)
    return LengthDist(
        kind="empirical", mean=round(mean, 1), low=low, high=high, quantiles=quantiles
    )


def gaps_cv(arrivals: np.ndarray) -> float:
    """The coefficient of variation of the inter-arrival gaps (1 for a Poisson process)."""
    gaps = np.diff(np.sort(arrivals))
    return float(np.std(gaps) / np.mean(gaps)) if len(gaps) > 1 and np.mean(gaps) > 0 else 1.0


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov distance: the largest gap between the two CDFs."""
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


@dataclass
class Fidelity:
    """How close a fitted workload is to its source."""

    prompt_ks: float
    output_ks: float
    source_cv: float | None  # None: the source has no arrival times (metrics)
    fit_cv: float
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        source = "unknown" if self.source_cv is None else f"{self.source_cv:.2f}"
        out = [
            f"KS distance of prompt lengths: {self.prompt_ks:.3f}",
            f"KS distance of output lengths: {self.output_ks:.3f}",
            f"arrival CV: source {source}, fit {self.fit_cv:.2f}",
        ]
        return out + self.notes


@dataclass
class Fit:
    """A fitted workload and its fidelity."""

    workload: WorkloadConfig
    fidelity: Fidelity
    source: str
    requests: int
    span_s: float | None = None
    prefix_hit_rate: float | None = None


def draw_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths drawn from a fitted distribution as the load generator draws them."""
    values = empirical_draws(dist.quantiles, n, rng)
    return np.clip(np.rint(values), max(1, dist.low), dist.high).astype(np.int64)


def fit_cv(workload: WorkloadConfig, seed: int) -> float:
    """The arrival CV of the fit, measured on gaps drawn as the load generator draws them."""
    rng = np.random.default_rng([seed, _STREAM_FIDELITY, 1])
    shape = workload.burstiness
    gaps = rng.gamma(shape, 1.0 / (workload.rate * shape), FIDELITY_DRAWS)
    return float(np.std(gaps) / np.mean(gaps))


def fitted_workload(
    prompt: LengthDist, output: LengthDist, rate: float, cv: float
) -> WorkloadConfig:
    burstiness = max(MIN_BURSTINESS, round(1.0 / cv**2, 4)) if cv > 0 else 1.0
    cls = RequestClass(name="fitted", prompt_tokens=prompt, output_tokens=output)
    return WorkloadConfig(
        classes=[cls],
        mode="open",
        rate=round(rate, 4),
        burstiness=burstiness,
        concurrency=512,
        prefix=PrefixConfig(),
    )


def fit_trace(trace: Trace, seed: int = 0) -> Fit:
    """Fit a workload to a whole trace and check it against the trace."""
    prompt = empirical(trace.prompt_tokens)
    output = empirical(trace.output_tokens)
    span = trace.span_s
    rate = (len(trace) - 1) / span if span > 0 else 1.0
    source_cv = gaps_cv(trace.arrivals)
    workload = fitted_workload(prompt, output, rate, source_cv)
    rng = np.random.default_rng([seed, _STREAM_FIDELITY])
    fidelity = Fidelity(
        prompt_ks=ks_distance(draw_lengths(prompt, FIDELITY_DRAWS, rng), trace.prompt_tokens),
        output_ks=ks_distance(draw_lengths(output, FIDELITY_DRAWS, rng), trace.output_tokens),
        source_cv=source_cv,
        fit_cv=fit_cv(workload, seed),
    )
    if workload.burstiness == MIN_BURSTINESS and source_cv > 0:
        fidelity.notes.append(
            f"burstiness held at {MIN_BURSTINESS} (the source's CV asks 1/CV^2 = "
            f"{1 / source_cv**2:.4f}): gamma gaps cannot follow bursts that extreme; replay "
            "the trace itself (workload=trace) to keep them"
        )
    return Fit(workload, fidelity, trace.source, len(trace), span)
