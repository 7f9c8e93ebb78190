"""A workload fitted to a running vLLM's own histograms, without a request log.

Two scrapes of ``/metrics`` ``window_s`` apart; the difference of their cumulative buckets is
the window's traffic: ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens`` give
the length quantiles (linear inside a bucket, as Prometheus' histogram_quantile), their counts
the request rate, the prefix-cache counters the hit rate. The histograms hold no arrival times:
the fit assumes Poisson arrivals and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tuner.config.workload import LengthDist
from tuner.errors import ConfigError
from tuner.traffic.fit import (
    FIDELITY_DRAWS,
    QUANTILES,
    Fidelity,
    Fit,
    draw_lengths,
    fit_cv,
    fitted_workload,
    from_quantiles,
)

PROMPT_HIST = "vllm:request_prompt_tokens"
OUTPUT_HIST = "vllm:request_generation_tokens"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


@dataclass
class Histogram:
    """Cumulative bucket counts by upper bound (``inf`` last), summed over label sets."""

    bounds: np.ndarray
    cumulative: np.ndarray

    def __sub__(self, earlier: Histogram) -> Histogram:
        return Histogram(self.bounds, self.cumulative - earlier.cumulative)

    @property
    def count(self) -> float:
        return float(self.cumulative[-1]) if len(self.cumulative) else 0.0

    def quantiles(self, n: int = QUANTILES) -> list[float]:
        """Lengths at p = 0 .. 1, linear inside each bucket (from its lower bound, 1 for the
        first); the +Inf bucket is read as its finite lower bound (the histogram says no more)."""
        top = self.bounds[np.isfinite(self.bounds)].max()
        edges = np.concatenate([[1.0], np.where(np.isinf(self.bounds), top, self.bounds)])
        cum = np.concatenate([[0.0], self.cumulative]) / self.count
        targets = np.clip(np.linspace(0.0, 1.0, n), 1e-12, 1.0)
        upper = np.clip(np.searchsorted(cum, targets, side="left"), 1, len(cum) - 1)
        below, above = cum[upper - 1], cum[upper]
        share = np.where(above > below, (targets - below) / np.maximum(above - below, 1e-300), 1.0)
        out = edges[upper - 1] + (edges[upper] - edges[upper - 1]) * share
        return [round(float(v), 1) for v in np.maximum.accumulate(np.maximum(out, 1.0))]

    def cdf(self, values: np.ndarray) -> np.ndarray:
        """The fraction of ``values`` at or below each finite bound."""
        finite = self.bounds[np.isfinite(self.bounds)]
        return np.searchsorted(np.sort(values), finite, side="right") / len(values)


@dataclass
class Scrape:
    histograms: dict[str, Histogram]
    counters: dict[str, float]


def fetch(url: str, timeout: float = 10.0) -> str:
    """The text of ``{url}/metrics`` (or ``url`` itself if it ends in /metrics)."""
    import requests

    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        response = requests.get(target, timeout=timeout)
        response.raise_for_status()
    except requests.RequestException as exc:
        raise ConfigError(
            f"cannot read the metrics of {target}: {type(exc).__name__}",
            hint="give the URL of a running vLLM server (its /metrics must answer)",
        ) from exc
    return response.text


def parse(text: str, where: str) -> Scrape:
    """vLLM's length histograms and prefix-cache counters from one scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[str, dict[float, float]] = {PROMPT_HIST: {}, OUTPUT_HIST: {}}
    counters: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                base = s.name.removesuffix("_bucket")
                if s.name.endswith("_bucket") and base in buckets:
                    le = float(s.labels["le"])
                    buckets[base][le] = buckets[base].get(le, 0.0) + s.value
                elif s.name in (PREFIX_QUERIES, PREFIX_HITS):
                    counters[s.name] = counters.get(s.name, 0.0) + s.value
    except ValueError as exc:
        raise ConfigError(f"{where} is not a Prometheus metrics page ({exc})") from exc
    missing = [name for name, b in buckets.items() if not b]
    if missing:
        raise ConfigError(
            f"{where} has no {' or '.join(missing)} histogram",
            hint="point --from-metrics at a vLLM server's /metrics (vLLM >= 0.6 exports them)",
        )
    hists = {
        name: Histogram(np.array(sorted(b)), np.array([b[k] for k in sorted(b)]))
        for name, b in buckets.items()
    }
    return Scrape(hists, counters)


def _fidelity(hist: Histogram, dist: LengthDist, rng: np.random.Generator) -> float:
    """KS distance between the fit's draws and the histogram, at the bucket bounds (the
    finest the histogram can tell)."""
    finite = np.isfinite(hist.bounds)
    source = hist.cumulative[finite] / hist.count
    return float(np.max(np.abs(hist.cdf(draw_lengths(dist, FIDELITY_DRAWS, rng)) - source)))


def fit_metrics(
    url: str, window_s: float, sleep: Callable[[float], None] = time.sleep, seed: int = 0
) -> Fit:
    """Scrape twice, ``window_s`` apart, and fit the window's traffic."""
    first = parse(fetch(url), url)
    sleep(window_s)
    second = parse(fetch(url), url)
    prompt = second.histograms[PROMPT_HIST] - first.histograms[PROMPT_HIST]
    output = second.histograms[OUTPUT_HIST] - first.histograms[OUTPUT_HIST]
    if prompt.count < 1 or output.count < 1:
        raise ConfigError(
            f"{url} finished no requests in the {window_s:g} s between the two scrapes",
            hint="fit while the deployment serves traffic, or lengthen --window-s",
        )
    p_dist = from_quantiles(prompt.quantiles(), _mean(prompt))
    o_dist = from_quantiles(output.quantiles(), _mean(output))
    workload = fitted_workload(p_dist, o_dist, output.count / window_s, 1.0)
    rng = np.random.default_rng([seed, 31])
    fidelity = Fidelity(
        _fidelity(prompt, p_dist, rng), _fidelity(output, o_dist, rng), None, fit_cv(workload, seed)
    )
    fidelity.notes.append(
        "arrivals assumed Poisson (burstiness 1): the histograms hold no arrival times"
    )
    queries = second.counters.get(PREFIX_QUERIES, 0.0) - first.counters.get(PREFIX_QUERIES, 0.0)
    hits = second.counters.get(PREFIX_HITS, 0.0) - first.counters.get(PREFIX_HITS, 0.0)
    rate = hits / queries if queries > 0 else None
    if rate is not None:
        fidelity.notes.append(f"prefix-cache hit rate in the window: {rate:.2f} (tokens)")
    return Fit(workload, fidelity, url, int(output.count), window_s, rate)


def _mean(hist: Histogram) -> float:
    """The mean length from the bucket midpoints (no _sum needed)."""
    q = np.asarray(hist.quantiles(QUANTILES), dtype=float)
    return float(np.mean((q[1:] + q[:-1]) / 2))
