"""The inference server's own Prometheus ``/metrics`` (vLLM 0.32 names), scraped and summarised.

Parsing uses ``prometheus_client.parser`` (the exposition format has escaping, labels and
histogram conventions that regexes get wrong). A scrape is flattened to ``sample name -> value``
summed over label sets (engines, finish reasons), e.g. ``vllm:num_requests_running``,
``vllm:num_preemptions_total``, ``vllm:time_to_first_token_seconds_sum``. Histogram buckets
and ``_created`` timestamps are dropped: summing them over labels means nothing.

The server may be dying while it is polled, so :class:`MetricsPoller` records a failed scrape
and goes on; only :func:`scrape` itself raises (:class:`ScrapeError`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import pandas as pd

from tuner.errors import ScrapeError
from tuner.telemetry._base import PeriodicSampler, Window

COLUMNS = ["t", "name", "value"]
PREFIX = "vllm:"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a 0-1 fraction despite the name
GAUGES = {
    "num_requests_running": RUNNING,
    "num_requests_waiting": WAITING,
    "kv_cache_usage": KV_USAGE,
}
COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "requests_succeeded": "vllm:request_success_total",
    # speculative decoding (--speculative-config): proposals, proposed and accepted tokens
    "spec_decode_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_decode_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_decode_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
HISTOGRAMS = {  # summary key -> histogram name; the mean over the window is delta sum / delta count
    "server_ttft_mean_s": "vllm:time_to_first_token_seconds",
    "server_itl_mean_s": "vllm:inter_token_latency_seconds",
    "server_tpot_mean_s": "vllm:request_time_per_output_token_seconds",
    "server_e2e_mean_s": "vllm:e2e_request_latency_seconds",
    "server_queue_mean_s": "vllm:request_queue_time_seconds",
}
_SKIPPED_SUFFIXES = ("_bucket", "_created")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``sample name -> value`` summed over label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith(_SKIPPED_SUFFIXES):
                    continue
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise ScrapeError(f"/metrics is not valid Prometheus text: {exc}") from exc
    return out


def scrape(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> dict[str, float]:
    """Fetch and parse ``{base_url}/metrics``; raises :class:`ScrapeError`."""
    # Imported here so that the NVML part of this package runs with numpy/pandas/psutil alone.
    import requests

    url = base_url.rstrip("/") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = requests.get(url, headers=headers, timeout=timeout)
        response.raise_for_status()
    except requests.RequestException as exc:
        raise ScrapeError(
            f"cannot scrape {url}: {exc}", hint="the server may have died: see its log"
        ) from exc
    return parse_metrics(response.text)


class MetricsPoller(PeriodicSampler):
    """Scrapes /metrics when started, every ``interval_s``, and when stopped."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        interval_s: float = 2.0,
        timeout_s: float | None = None,
    ) -> None:
        super().__init__(interval_s, "metrics")
        self.base_url = base_url
        self.api_key = api_key
        # A scrape must finish before the next is due, or a hung server would stall stop().
        self.timeout_s = timeout_s if timeout_s is not None else max(1.0, interval_s)
        self._scrapes: list[tuple[float, dict[str, float]]] = []
        self._failures: list[tuple[float, str]] = []

    def _sample(self) -> None:
        now = time.time()
        try:
            values = scrape(self.base_url, self.api_key, self.timeout_s)
        except ScrapeError as exc:
            with self._lock:
                self._failures.append((now, exc.message))
            self._note(f"scrape failed: {exc.message}")
            return
        kept = {k: v for k, v in values.items() if k.startswith(PREFIX)}
        if not kept:
            self._note("/metrics has no vllm: metrics (is --disable-log-stats set?)")
        with self._lock:
            self._scrapes.append((now, kept))

    @property
    def scrapes(self) -> list[tuple[float, dict[str, float]]]:
        """Successful scrapes as (time, values), oldest first."""
        with self._lock:
            return list(self._scrapes)

    @property
    def failures(self) -> list[tuple[float, str]]:
        """Failed scrapes as (time, reason)."""
        with self._lock:
            return list(self._failures)

    @property
    def samples(self) -> pd.DataFrame:
        """Every scraped vLLM value, long format: columns t, name, value."""
        rows = [(t, name, v) for t, values in self.scrapes for name, v in values.items()]
        return pd.DataFrame(rows, columns=COLUMNS)

    def summary(self, window: Window | None = None) -> dict[str, float]:
        """Gauges (max/mean over scrapes in the window) and counter/histogram deltas across it.

        Keys whose value cannot be known (no scrape, no queries, a counter reset) are left out.
        """
        scrapes = self.scrapes
        out: dict[str, float] = {
            "scrapes": float(len(scrapes)),
            "scrape_failures": float(len(self.failures)),
        }
        out.update(_gauge_stats(_inside(scrapes, window)))
        first, last = _bracket(scrapes, window)
        if first is not None and last is not None:
            out.update(self._deltas(first[1], last[1]))
            # What the deltas cover: the client's side of the clock check is taken over it.
            out["deltas_from"], out["deltas_to"] = first[0], last[0]
        return out

    def _deltas(self, first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
        out = counter_deltas(first, last)
        for name in COUNTERS.values():
            if name in first and name in last and _delta(first, last, name) is None:
                self._note(f"{name} went down (server restarted?)")
        out.update(histogram_means(first, last))
        return out


def counter_deltas(first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
    """Each counter's increase between two scrapes (keyed as in COUNTERS), and the prefix-cache
    hit rate when anything was queried; a counter missing from either, or gone down, is left out."""
    out: dict[str, float] = {}
    for key, name in COUNTERS.items():
        delta = _delta(first, last, name)
        if delta is not None:
            out[key] = delta
    queries = out.get("prefix_cache_queries", 0.0)
    if queries > 0:
        out["prefix_cache_hit_rate"] = out.get("prefix_cache_hits", 0.0) / queries
    out.update(spec_decode_rates(out))
    return out


def spec_decode_rates(deltas: dict[str, float]) -> dict[str, float]:
    """What speculative decoding achieved over the deltas, as vLLM defines it: the share of
    proposed tokens the target model accepted, and the mean acceptance length (tokens a step
    yields per draft: the target's own one plus the accepted ones). Empty where nothing was
    proposed (no --speculative-config, or no decode step in the window)."""
    drafts, proposed = (
        deltas.get("spec_decode_drafts", 0.0),
        deltas.get("spec_decode_draft_tokens", 0.0),
    )
    if proposed <= 0 or drafts <= 0:
        return {}
    accepted = deltas.get("spec_decode_accepted_tokens", 0.0)
    return {
        "spec_decode_acceptance_rate": accepted / proposed,
        "spec_decode_mean_acceptance_length": 1.0 + accepted / drafts,
    }


def histogram_means(first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
    """The server's own mean latencies between two scrapes (keyed as in HISTOGRAMS): each
    histogram's delta sum over its delta count; one with no new observations is left out."""
    out: dict[str, float] = {}
    for key, name in HISTOGRAMS.items():
        count = _delta(first, last, f"{name}_count")
        total = _delta(first, last, f"{name}_sum")
        if count and total is not None:
            out[key] = total / count
    return out


def over_server(
    client_means: Mapping[str, float | None], server: Mapping[str, float]
) -> dict[str, float]:
    """Each of the client's mean latencies (``ttft``, ``tpot``, ``e2e``) over the server's own
    mean of the same kind over the same window (``server_<kind>_mean_s``, from
    :func:`histogram_means`): 1.0 when the client timed what the server did. A kind that either
    side lacks is left out."""
    out: dict[str, float] = {}
    for kind, mean in client_means.items():
        own = server.get(f"server_{kind}_mean_s")
        if mean is not None and own:
            out[kind] = mean / own
    return out


def client_lag_warning(ratios: Mapping[str, float], limit: float) -> str | None:
    """A warning when tokens reached the client markedly later than vLLM's engine made them.

    A healthy client reads TPOT within 1.5 % of the server's and E2E 2-5 % above it (the HTTP
    and tokenization work its clock adds, as measured in benchmarks/); TTFT, small and
    offset by that same work, does not judge. When the client or vLLM's API server (HTTP,
    detokenization, streaming: outside the engine's histograms) runs out of CPU, tokens arrive
    late and in bursts: the mean E2E grows and TPOT moves either way, above ``limit`` when
    every token is late, below ``1 / limit`` when they pile up and arrive together (a real
    trial on a 2-core Zen 5 VM, vLLM's processes on 1.9 of the 2 cores, its API server at
    0.2 and the client at 0.07: E2E 2.0-3.5x, TPOT 0.69-0.91x, TTFT 8-21x). tuner.host.placement
    keeps the client off a CPU server's cores by default."""
    tpot, e2e = ratios.get("tpot"), ratios.get("e2e")
    off = []
    if tpot is not None and not 1 / limit < tpot < limit:
        off.append(f"TPOT {tpot:.2f}x")
    if e2e is not None and e2e >= limit:
        off.append(f"E2E {e2e:.2f}x")
    if not off:
        return None
    return (
        f"the client's mean {' and '.join(off)} vLLM's own (its /metrics histograms): tokens "
        "reached the client late or in bursts, so the time went outside vLLM's engine, in the "
        "client or in vLLM's API server process, waiting for CPU (placement.client_cpus "
        "keeps the client off the server's CPUs)"
    )


def _delta(first: dict[str, float], last: dict[str, float], name: str) -> float | None:
    if name not in first or name not in last:
        return None
    delta = last[name] - first[name]
    return delta if delta >= 0 else None


def _inside(
    scrapes: list[tuple[float, dict[str, float]]], window: Window | None
) -> list[dict[str, float]]:
    if window is None:
        return [values for _, values in scrapes]
    return [values for t, values in scrapes if window[0] <= t <= window[1]]


Scrape = tuple[float, dict[str, float]]


def _bracket(scrapes: list[Scrape], window: Window | None) -> tuple[Scrape | None, Scrape | None]:
    """The scrapes that bracket the window: last at/before its start, first at/after its end.

    Without one before (or after), the first (last) scrape inside stands in.
    """
    if not scrapes:
        return None, None
    if window is None:
        return scrapes[0], scrapes[-1]
    start, end = window
    before = [s for s in scrapes if s[0] <= start]
    after = [s for s in scrapes if s[0] >= end]
    inside = [s for s in scrapes if start < s[0] < end]
    first = before[-1] if before else (inside[0] if inside else (after[0] if after else None))
    last = after[0] if after else (inside[-1] if inside else (before[-1] if before else None))
    return first, last


def _gauge_stats(scrapes: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in GAUGES.items():
        values = [s[name] for s in scrapes if name in s and not math.isnan(s[name])]
        if values:
            out[f"{key}_max"] = max(values)
            out[f"{key}_mean"] = sum(values) / len(values)
    return out
