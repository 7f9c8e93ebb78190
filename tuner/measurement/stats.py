"""Raw per-request records -> :class:`Measurements` (latency percentiles, throughput, goodput).

Definitions follow vLLM's ``vllm bench serve`` so our numbers are
comparable with it:

- TTFT, E2E: per completed request, as the client measured them.
- TPOT: ``(e2e - ttft) / (output_tokens - 1)``, only for requests with more than one output token
  (what GuideLLM and AIPerf call "ITL").
- ITL: every gap between token-bearing events, pooled over all completed requests.
- Percentiles: ``np.percentile`` with its default (linear) method over the raw samples.
- Throughputs and goodput: counts of completed requests divided by the window length.

A request is *measured* when ``phase == "measure"`` and ``window_start <= sent_at < window_end``;
it may finish after ``window_end`` (the load generator lets it drain), because dropping the slow
in-flight requests would flatter the tail. A failed request is never a latency sample; it counts in
``error_rate`` and ``errors_by_kind``. A request *rejected* because it does not fit the server's
context (``error_kind`` "rejected": a tier cap's max_model_len) is neither a sample nor an error
of the server: it counts in ``rejected`` and ``rejected_rate`` (of the requests started), and
``error_rate`` is over the requests the server accepted. Statistics of an empty sample are
``None`` (JSON null), never NaN or zero, so "no data" cannot pass for a perfect latency.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.config import SloConfig
from tuner.measurement.measurements import ClassStats, Measurements, MetricStats
from tuner.measurement.records import ERROR_REJECTED, ERROR_STREAM, PHASE_MEASURE, RequestRecord

# A distribution-free two-sided 95 % CI for P99 whose upper end is the sample maximum exists only
# when 1 - 0.99**n >= 0.975, i.e. n >= 368.
MIN_SAMPLES_P99_CI = 368
# An open-loop client that sends later than scheduled offers less load than asked; above this the
# arrival process is no longer what the workload says (the notes saw <= 3 ms when healthy).
DISPATCH_LAG_WARN_S = 0.010
# Fewer P50 E2E latencies per window than this and a closed-loop user starts only a handful
# of requests in it: +-1 request per user moves output tok/s by 10-50 % (measured on a grid with
# 5 s requests in a 10 s window: many configurations at exactly 2 requests per user).
MIN_LATENCIES_PER_WINDOW = 5.0
# Four slices: a 15-s quickstart window still gives each a few thousand tokens to count.
WINDOW_SLICES = 4
UNKNOWN_ERROR = "unknown"


def _in_window(rec: RequestRecord, start: float, end: float) -> bool:
    return rec.phase == PHASE_MEASURE and start <= rec.sent_at < end


def _is_completed(rec: RequestRecord) -> bool:
    return rec.ok and rec.e2e_s is not None


def _tpot(rec: RequestRecord) -> float | None:
    out = rec.output_tokens
    if rec.e2e_s is None or rec.ttft_s is None or out is None or out <= 1:
        return None
    return (rec.e2e_s - rec.ttft_s) / (out - 1)


def _meets_slo(rec: RequestRecord, slo: SloConfig) -> bool:
    """Per-request SLO check as in vllm bench serve's goodput (inclusive; 0 = not set).

    A request without a TPOT (one output token) meets the TPOT SLO vacuously, as there.
    """
    checks = (
        (slo.p99_ttft_s, rec.ttft_s),
        (slo.p99_tpot_s, _tpot(rec)),
        (slo.p99_e2e_s, rec.e2e_s),
    )
    for limit, value in checks:
        if limit > 0 and value is not None and value > limit:
            return False
    # A missing TTFT cannot be shown to meet a set TTFT SLO.
    return not (slo.p99_ttft_s > 0 and rec.ttft_s is None)


def _is_rejected(rec: RequestRecord) -> bool:
    return not rec.ok and rec.error_kind == ERROR_REJECTED


def _error_kind(rec: RequestRecord) -> str:
    if rec.ok:  # marked ok but without an E2E: the stream ended before any token
        return ERROR_STREAM
    return rec.error_kind or UNKNOWN_ERROR


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


@dataclass
class _Sample:
    """The measured requests of one window, split the way the statistics need them."""

    started: list[RequestRecord]
    done: list[RequestRecord]
    failures: list[RequestRecord]  # the server's errors (and the client's)
    rejected: list[RequestRecord]  # refused as too long for the server's context

    @property
    def error_rate(self) -> float:
        """Failures over the requests the server accepted (a rejected one it did not)."""
        accepted = len(self.started) - len(self.rejected)
        return len(self.failures) / accepted if accepted else 0.0

    @property
    def rejected_rate(self) -> float:
        return len(self.rejected) / len(self.started) if self.started else 0.0


def _sample_of(started: list[RequestRecord]) -> _Sample:
    done = [r for r in started if _is_completed(r)]
    rejected = [r for r in started if _is_rejected(r)]
    failures = [r for r in started if not _is_completed(r) and not _is_rejected(r)]
    return _Sample(started, done, failures, rejected)


def _split(records: Iterable[RequestRecord], start: float, end: float) -> _Sample:
    return _sample_of([r for r in records if _in_window(r, start, end)])


def _latency_stats(done: list[RequestRecord]) -> dict[str, MetricStats]:
    tpots = [t for t in (_tpot(r) for r in done) if t is not None]
    return {
        "ttft": MetricStats.of([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot": MetricStats.of(tpots),
        "itl": MetricStats.of([gap for r in done for gap in r.itl_s]),
        "e2e": MetricStats.of([r.e2e_s for r in done if r.e2e_s is not None]),
    }


def span_means(
    records: Iterable[RequestRecord], start: float, end: float
) -> dict[str, float | None]:
    """Mean TTFT, TPOT and E2E over the requests a server's histogram deltas between two
    scrapes at ``start`` and ``end`` hold, warm-up or not: vLLM observes a TTFT when the first
    token is made and TPOT and E2E when the request finishes. (The window's requests are those
    *sent* in it; with requests of seconds and a 10-s window the sets differ enough to move a
    mean by 10 %.)"""
    done = [r for r in records if _is_completed(r)]
    finished = _latency_stats([r for r in done if start <= (r.finished_at or 0.0) <= end])
    first = [
        r.ttft_s for r in done if r.ttft_s is not None and start <= r.sent_at + r.ttft_s <= end
    ]
    return {
        "ttft": MetricStats.of(first).mean,
        "tpot": finished["tpot"].mean,
        "e2e": finished["e2e"].mean,
    }


def _adjusted_e2e_p99(sample: _Sample, timeout_s: float | None) -> float | None:
    if timeout_s is None or not sample.started:
        return None
    values = [r.e2e_s for r in sample.done if r.e2e_s is not None]
    return _percentile(values + [timeout_s] * len(sample.failures), 99)


def _throughputs(sample: _Sample, window_s: float, slo: SloConfig) -> tuple[float, ...]:
    """(request, output token, total token, goodput) rates over the window."""
    prompt = sum(r.prompt_tokens or 0 for r in sample.done)
    output = sum(r.output_tokens or 0 for r in sample.done)
    good = sum(1 for r in sample.done if _meets_slo(r, slo))
    return tuple(x / window_s for x in (len(sample.done), output, prompt + output, good))


def token_rate(records: Sequence[RequestRecord], start: float, end: float) -> float | None:
    """Output tokens generated in ``[start, end)`` per second, over every request's token
    events (first token at sent_at + ttft_s, then each ITL gap); an event carries
    output_tokens / events tokens (vLLM may put several tokens in one SSE event)."""
    total, timed = 0.0, False
    for r in records:
        if r.ttft_s is None:
            continue
        times = r.sent_at + r.ttft_s + np.concatenate(([0.0], np.cumsum(r.itl_s)))
        per_event = (r.output_tokens or len(times)) / len(times)
        total += per_event * np.count_nonzero((times >= start) & (times < end))
        timed = True
    return total / (end - start) if timed else None


def event_rate(records: Sequence[RequestRecord], start: float, end: float) -> float | None:
    """Token-bearing SSE events the client read in ``[start, end)`` per second, over every
    request (what one load-generator process pays for, one parse each); None without any."""
    total, timed = 0, False
    for r in records:
        if r.ttft_s is None:
            continue
        times = r.sent_at + r.ttft_s + np.concatenate(([0.0], np.cumsum(r.itl_s)))
        total += int(np.count_nonzero((times >= start) & (times < end)))
        timed = True
    return total / (end - start) if timed and end > start else None


def window_slices(
    records: Sequence[RequestRecord], start: float, end: float, n: int = WINDOW_SLICES
) -> list[float]:
    """:func:`token_rate` in ``n`` equal consecutive parts of ``[start, end)``."""
    edges = np.linspace(start, end, n + 1)
    rates = [token_rate(records, float(a), float(b)) for a, b in itertools.pairwise(edges)]
    return [] if any(r is None for r in rates) else [float(r or 0.0) for r in rates]


def _token_means(done: list[RequestRecord]) -> tuple[float | None, float | None]:
    prompt = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    output = [r.output_tokens for r in done if r.output_tokens is not None]
    return _mean(prompt), _mean(output)


def _sample_size_warnings(stats: dict[str, MetricStats]) -> list[str]:
    by_n: dict[int, list[str]] = {}
    for name in ("ttft", "tpot", "e2e"):  # ITL pools every gap, so its n is rarely the issue
        n = stats[name].n
        if 0 < n < MIN_SAMPLES_P99_CI:
            by_n.setdefault(n, []).append(name)
    return [
        f"P99 of {', '.join(names)} rests on {n} samples (< {MIN_SAMPLES_P99_CI} needed for a "
        "distribution-free 95% CI)"
        for n, names in by_n.items()
    ]


def _short_window(stats: dict[str, MetricStats], window_s: float) -> list[str]:
    """A window of few request latencies: the counts behind every throughput are coarse."""
    p50 = stats["e2e"].p50
    if p50 is None or window_s >= MIN_LATENCIES_PER_WINDOW * p50:
        return []
    return [
        f"the {window_s:.0f} s window holds only {window_s / p50:.1f} P50 E2E latencies "
        f"({p50:.2f} s): each user starts about as many requests, so throughput counts are "
        f"coarse; set workload.window_s >= {MIN_LATENCIES_PER_WINDOW * p50:.0f}"
    ]


def _warnings(
    sample: _Sample, stats: dict[str, MetricStats], lag_p99: float | None, window_s: float
) -> list[str]:
    out: list[str] = _short_window(stats, window_s)
    if not sample.started:
        out.append("no requests were started in the measurement window")
    elif not sample.done:
        out.append("no completed requests")
    out.extend(_sample_size_warnings(stats))
    if lag_p99 is not None and lag_p99 > DISPATCH_LAG_WARN_S:
        late = _late_sends(sample.started)
        out.append(
            f"client dispatch lag P99 {lag_p99 * 1e3:.1f} ms ({late} of {len(sample.started)} "
            f"requests sent > {DISPATCH_LAG_WARN_S * 1e3:.0f} ms late): the load generator sent "
            "later than scheduled, so the offered load was lower than configured"
        )
    no_usage = sum(1 for r in sample.done if r.output_tokens is None)
    if no_usage:
        out.append(f"{no_usage} completed requests lack usage.output_tokens (counted as 0 tokens)")
    hollow = sum(1 for r in sample.failures if r.ok)
    if hollow:
        out.append(f"{hollow} requests marked ok have no e2e_s; counted as stream errors")
    if sample.rejected:
        classes = Counter(r.request_class for r in sample.rejected)
        where = ", ".join(f"{name} {n}" for name, n in sorted(classes.items()))
        out.append(
            f"{len(sample.rejected)} of {len(sample.started)} requests rejected as longer than "
            f"the server's max_model_len ({where}): neither latency samples nor server errors; "
            "slo.max_rejected_rate bounds them"
        )
    return out


def _class_stats(sample: _Sample, window_s: float, slo: SloConfig) -> ClassStats:
    # The same functions as the totals, on the class's part of the window: one definition.
    stats = _latency_stats(sample.done)
    _, out_tput, _, goodput = _throughputs(sample, window_s, slo)
    return ClassStats(
        ttft=stats["ttft"],
        tpot=stats["tpot"],
        e2e=stats["e2e"],
        requests_started=len(sample.started),
        completed=len(sample.done),
        failed=len(sample.failures),
        error_rate=sample.error_rate,
        output_throughput=out_tput,
        goodput=goodput,
        rejected=len(sample.rejected),
        rejected_rate=sample.rejected_rate,
    )


def _by_class(sample: _Sample, window_s: float, slo: SloConfig) -> dict[str, ClassStats]:
    """Each request class's stats over the window's requests of that class, by name."""
    groups: dict[str, list[RequestRecord]] = {}
    for rec in sample.started:
        groups.setdefault(rec.request_class, []).append(rec)
    return {name: _class_stats(_sample_of(groups[name]), window_s, slo) for name in sorted(groups)}


def _late_sends(started: list[RequestRecord]) -> int:
    return sum(1 for r in started if r.sent_at - r.scheduled_at > DISPATCH_LAG_WARN_S)


def measure(
    records: Iterable[RequestRecord],
    window_start: float,
    window_end: float,
    slo: SloConfig,
    *,
    timeout_s: float | None = None,
) -> Measurements:
    """Summarise the requests sent in ``[window_start, window_end)`` of the measure phase.

    ``timeout_s`` (the request timeout) enables :attr:`Measurements.e2e_p99_adjusted_s`.
    """
    if window_end <= window_start:
        raise ValueError(f"empty measurement window [{window_start}, {window_end})")
    window_s = window_end - window_start
    records = list(records)
    sample = _split(records, window_start, window_end)
    stats = _latency_stats(sample.done)
    lag_p99 = _percentile([r.sent_at - r.scheduled_at for r in sample.started], 99)
    req_tput, out_tput, total_tput, goodput = _throughputs(sample, window_s, slo)
    mean_prompt, mean_output = _token_means(sample.done)
    return Measurements(
        ttft=stats["ttft"],
        tpot=stats["tpot"],
        itl=stats["itl"],
        e2e=stats["e2e"],
        window_s=window_s,
        requests_started=len(sample.started),
        completed=len(sample.done),
        failed=len(sample.failures),
        errors_by_kind=dict(Counter(_error_kind(r) for r in sample.failures)),
        error_rate=sample.error_rate,
        request_throughput=req_tput,
        output_throughput=out_tput,
        total_throughput=total_tput,
        goodput=goodput,
        mean_prompt_tokens=mean_prompt,
        mean_output_tokens=mean_output,
        dispatch_lag_p99_s=lag_p99,
        e2e_p99_adjusted_s=_adjusted_e2e_p99(sample, timeout_s),
        output_token_rate=token_rate(records, window_start, window_end),
        window_slices=window_slices(records, window_start, window_end),
        late_sends=_late_sends(sample.started),
        rejected=len(sample.rejected),
        rejected_rate=sample.rejected_rate,
        warnings=_warnings(sample, stats, lag_p99, window_s),
        by_class=_by_class(sample, window_s, slo),
    )
