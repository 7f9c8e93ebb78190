"""Raw request records -> Measurements: definitions, window rules, errors, goodput, JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tuner.config import SloConfig
from tuner.measurement.records import (
    ERROR_CONNECTION,
    ERROR_HTTP,
    ERROR_TIMEOUT,
    PHASE_MEASURE,
    PHASE_WARMUP,
    RequestRecord,
)
from tuner.measurement.stats import (
    MIN_SAMPLES_P99_CI,
    Measurements,
    MetricStats,
    measure,
    span_means,
    window_slices,
)

T0 = 1_000.0  # window start
T1 = 1_010.0  # window end: a 10 s window
NO_SLO = SloConfig()


def ok(
    sent_at: float,
    ttft: float = 0.1,
    e2e: float = 1.0,
    out: int = 11,
    prompt: int = 100,
    phase: str = PHASE_MEASURE,
    itl: list[float] | None = None,
    scheduled_at: float | None = None,
) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{sent_at}",
        request_class="default",
        api="completions",
        phase=phase,
        scheduled_at=sent_at if scheduled_at is None else scheduled_at,
        sent_at=sent_at,
        ok=True,
        status=200,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=[] if itl is None else itl,
        prompt_tokens=prompt,
        output_tokens=out,
    )


def failed(sent_at: float, kind: str, phase: str = PHASE_MEASURE) -> RequestRecord:
    return RequestRecord(
        request_id=f"f{sent_at}",
        request_class="default",
        api="completions",
        phase=phase,
        scheduled_at=sent_at,
        sent_at=sent_at,
        ok=False,
        status=503 if kind == ERROR_HTTP else 0,
        error_kind=kind,
        error="boom",
    )


def test_percentiles_equal_numpy_linear() -> None:
    rng = np.random.default_rng(0)
    e2e = rng.lognormal(0.0, 0.5, 500)
    ttft = rng.uniform(0.01, 0.3, 500)
    recs = [
        ok(T0 + i * 0.01, ttft=float(a), e2e=float(b))
        for i, (a, b) in enumerate(zip(ttft, e2e, strict=True))
    ]
    m = measure(recs, T0, T1, NO_SLO)
    for stats, raw in ((m.e2e, e2e), (m.ttft, ttft)):
        assert stats.n == 500
        expected = np.percentile(raw, [50, 90, 95, 99])
        assert [stats.p50, stats.p90, stats.p95, stats.p99] == pytest.approx(expected, rel=1e-12)
        assert stats.mean == pytest.approx(raw.mean())
        assert (stats.min, stats.max) == (raw.min(), raw.max())


def test_itl_pools_every_gap() -> None:
    recs = [ok(T0 + 1, itl=[0.01, 0.02, 0.03]), ok(T0 + 2, itl=[0.5])]
    m = measure(recs, T0, T1, NO_SLO)
    assert m.itl.n == 4
    assert m.itl.p99 == pytest.approx(np.percentile([0.01, 0.02, 0.03, 0.5], 99))
    assert m.itl.max == 0.5


def test_tpot_formula_and_single_token_requests_skipped() -> None:
    recs = [
        ok(T0 + 1, ttft=0.2, e2e=1.2, out=11),  # (1.2 - 0.2) / 10 = 0.1
        ok(T0 + 2, ttft=0.1, e2e=0.5, out=5),  # (0.5 - 0.1) / 4 = 0.1
        ok(T0 + 3, ttft=0.3, e2e=0.3, out=1),  # one token: no TPOT
    ]
    m = measure(recs, T0, T1, NO_SLO)
    assert m.tpot.n == 2
    assert m.tpot.mean == pytest.approx(0.1)
    assert m.ttft.n == 3


def test_window_excludes_warmup_and_out_of_window_requests() -> None:
    inside_late_finish = ok(T1 - 0.5, e2e=30.0)  # sent in the window, finished long after it
    recs = [
        ok(T0 + 1, phase=PHASE_WARMUP, e2e=99.0),
        ok(T0 - 0.001, e2e=98.0),  # before the window
        ok(T1, e2e=97.0),  # at window_end: excluded (half-open)
        ok(T0, e2e=1.0),  # at window_start: included
        inside_late_finish,
        failed(T0 + 1, ERROR_HTTP, phase=PHASE_WARMUP),
        failed(T1 + 1, ERROR_HTTP),
    ]
    m = measure(recs, T0, T1, NO_SLO)
    assert m.requests_started == 2
    assert m.completed == 2 and m.failed == 0
    assert m.e2e.max == 30.0 and m.e2e.min == 1.0
    assert m.error_rate == 0.0


def test_failures_are_errors_not_latency_samples() -> None:
    recs = [ok(T0 + i, e2e=1.0) for i in range(6)] + [
        failed(T0 + 1.5, ERROR_HTTP),
        failed(T0 + 2.5, ERROR_CONNECTION),
        failed(T0 + 3.5, ERROR_CONNECTION),
        failed(T0 + 4.5, ""),  # a failure without a kind is still counted
    ]
    m = measure(recs, T0, T1, NO_SLO, timeout_s=60.0)
    assert (m.requests_started, m.completed, m.failed) == (10, 6, 4)
    assert m.e2e.n == 6 and m.e2e.max == 1.0
    assert m.error_rate == pytest.approx(0.4)
    assert m.errors_by_kind == {ERROR_HTTP: 1, ERROR_CONNECTION: 2, "unknown": 1}
    # adjusted P99: the 4 failures count as the 60 s timeout
    assert m.e2e_p99_adjusted_s == pytest.approx(np.percentile([1.0] * 6 + [60.0] * 4, 99))


def test_ok_record_without_e2e_is_counted_as_stream_error() -> None:
    hollow = ok(T0 + 1)
    hollow.e2e_s = None
    m = measure([hollow, ok(T0 + 2)], T0, T1, NO_SLO)
    assert m.failed == 1 and m.errors_by_kind == {"stream": 1}
    assert any("marked ok" in w for w in m.warnings)


def test_throughput_arithmetic() -> None:
    recs = [ok(T0 + i, prompt=100, out=20) for i in range(5)] + [failed(T0 + 6, ERROR_TIMEOUT)]
    m = measure(recs, T0, T1, NO_SLO)
    assert m.window_s == 10.0
    assert m.request_throughput == pytest.approx(5 / 10)
    assert m.output_throughput == pytest.approx(5 * 20 / 10)
    assert m.total_throughput == pytest.approx(5 * 120 / 10)
    assert (m.mean_prompt_tokens, m.mean_output_tokens) == (100.0, 20.0)


def test_goodput_counts_requests_meeting_every_set_slo() -> None:
    recs = [
        ok(T0 + 1, ttft=0.1, e2e=1.0, out=11),  # tpot 0.09: good
        ok(T0 + 2, ttft=0.6, e2e=1.0, out=11),  # ttft too slow
        ok(T0 + 3, ttft=0.1, e2e=2.1, out=11),  # tpot 0.2 too slow
        ok(T0 + 4, ttft=0.1, e2e=3.0, out=2),  # e2e too slow (tpot 2.9 too)
        ok(T0 + 5, ttft=0.5, e2e=0.5, out=1),  # at the TTFT limit, no TPOT: good
        failed(T0 + 6, ERROR_HTTP),  # never good
    ]
    slo = SloConfig(p99_ttft_s=0.5, p99_tpot_s=0.1, p99_e2e_s=2.5)
    assert measure(recs, T0, T1, slo).goodput == pytest.approx(2 / 10)
    only_e2e = SloConfig(p99_e2e_s=2.5)  # 0 = unset: only E2E matters
    assert measure(recs, T0, T1, only_e2e).goodput == pytest.approx(4 / 10)
    assert measure(recs, T0, T1, NO_SLO).goodput == pytest.approx(5 / 10)


def test_sample_count_warning() -> None:
    few = measure([ok(T0 + i * 0.01) for i in range(120)], T0, T1, NO_SLO)
    assert any("rests on 120 samples" in w and str(MIN_SAMPLES_P99_CI) in w for w in few.warnings)
    many = [ok(T0 + i * 0.001) for i in range(MIN_SAMPLES_P99_CI)]
    assert not any("rests on" in w for w in measure(many, T0, T1, NO_SLO).warnings)


def test_dispatch_lag_reported_and_warned() -> None:
    recs = [ok(T0 + i * 0.1, scheduled_at=T0 + i * 0.1 - 0.05) for i in range(50)]
    m = measure(recs, T0, T1, NO_SLO)
    assert m.dispatch_lag_p99_s == pytest.approx(0.05)
    assert any("dispatch lag P99 50.0 ms" in w for w in m.warnings)
    calm = measure([ok(T0 + 1)], T0, T1, NO_SLO)
    assert calm.dispatch_lag_p99_s == 0.0
    assert not any("dispatch lag" in w for w in calm.warnings)


def test_no_completed_requests_gives_none_not_zero() -> None:
    m = measure([failed(T0 + 1, ERROR_HTTP)], T0, T1, NO_SLO)
    assert m.e2e == MetricStats() and m.e2e.p99 is None
    assert m.error_rate == 1.0 and m.request_throughput == 0.0
    assert "no completed requests" in m.warnings
    assert math.isnan(m.flat()["e2e_p99_s"])
    empty = measure([], T0, T1, NO_SLO)
    assert empty.requests_started == 0 and empty.error_rate == 0.0
    assert any("no requests were started" in w for w in empty.warnings)


def test_json_round_trip_is_strict_json() -> None:
    recs = [ok(T0 + i, itl=[0.01, 0.02]) for i in range(5)] + [failed(T0 + 5, ERROR_HTTP)]
    m = measure(recs, T0, T1, SloConfig(p99_e2e_s=2.0))
    text = json.dumps(m.to_dict(), allow_nan=False)  # no NaN/inf may leak into JSON
    back = Measurements.from_dict(json.loads(text))
    assert back == m
    empty = measure([], T0, T1, NO_SLO)
    assert Measurements.from_dict(json.loads(json.dumps(empty.to_dict(), allow_nan=False))) == empty


def test_flat_names_and_table() -> None:
    m = measure([ok(T0 + 1, ttft=0.2, e2e=1.5, out=11), failed(T0 + 2, ERROR_HTTP)], T0, T1, NO_SLO)
    flat = m.flat()
    assert flat["e2e_p99_s"] == 1.5 and flat["ttft_p50_s"] == 0.2
    assert flat["output_throughput_tok_s"] == pytest.approx(1.1)
    assert flat["error_rate"] == 0.5 and flat["goodput_req_s"] == pytest.approx(0.1)
    assert flat["errors_http"] == 1.0 and flat["errors_timeout"] == 0.0
    assert all(isinstance(v, float) for v in flat.values())
    table = m.table()
    assert list(table.index) == ["ttft", "tpot", "itl", "e2e"]
    assert list(table.columns) == ["mean", "p50", "p90", "p95", "p99", "n"]
    assert table.loc["e2e", "p99"] == 1.5 and table.loc["itl", "n"] == 0


def test_empty_window_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty measurement window"):
        measure([], T1, T0, NO_SLO)


def test_a_window_of_few_latencies_is_flagged() -> None:
    long = [ok(T0 + i, e2e=4.0) for i in range(6)]  # 10 s window, 4 s requests: 2.5 per window
    m = measure(long, T0, T1, NO_SLO)
    (warning,) = [w for w in m.warnings if "window" in w]
    assert "2.5 P50 E2E latencies" in warning and "workload.window_s >= 20" in warning
    short = measure([ok(T0 + i, e2e=1.0) for i in range(6)], T0, T1, NO_SLO)
    assert not [w for w in short.warnings if "P50 E2E latencies" in w]


def test_output_token_rate_counts_tokens_generated_inside_the_window() -> None:
    # Sent in the warm-up: events at T0-0.5, T0, ..., T0+4.0 -> 9 of its 10 tokens in the window.
    early = ok(T0 - 1, ttft=0.5, e2e=5.0, out=10, itl=[0.5] * 9, phase="warmup")
    # 10 events carrying 2 tokens each, all inside.
    batched = ok(T0 + 1, ttft=0.1, e2e=1.0, out=20, itl=[0.1] * 9)
    # Sent at the end: first event at T1-0.2, then T1+0.3...: 1 of 5 tokens inside.
    late = ok(T1 - 0.4, ttft=0.2, e2e=2.2, out=5, itl=[0.5] * 4)
    m = measure([early, batched, late, failed(T0 + 2, ERROR_TIMEOUT)], T0, T1, NO_SLO)
    assert m.output_token_rate == pytest.approx((9 + 20 + 1) / 10)
    # output_throughput counts whole requests sent in the window instead: 20 + 5 tokens.
    assert m.output_throughput == pytest.approx(25 / 10)
    assert m.flat()["output_token_rate_tok_s"] == pytest.approx(3.0)
    assert measure([failed(T0 + 1, ERROR_TIMEOUT)], T0, T1, NO_SLO).output_token_rate is None


def test_window_slices_are_the_token_rate_in_equal_parts_of_the_window() -> None:
    # 20 tokens 0.25 s apart from T0 (the first half), then 40 tokens 0.125 s apart from T0+5.
    first = ok(T0 - 0.05, ttft=0.05, e2e=4.8, out=20, itl=[0.25] * 19)
    second = ok(T0 + 4.95, ttft=0.05, e2e=4.93, out=40, itl=[0.125] * 39)
    assert window_slices([first, second], T0, T1) == pytest.approx([4.0, 4.0, 8.0, 8.0])
    m = measure([first, second], T0, T1, NO_SLO)
    assert m.window_slices == pytest.approx([4.0, 4.0, 8.0, 8.0])
    assert Measurements.from_dict(m.to_dict()).window_slices == m.window_slices
    assert measure([failed(T0 + 1, ERROR_TIMEOUT)], T0, T1, NO_SLO).window_slices == []


def test_span_means_take_the_requests_the_servers_histograms_saw_in_the_span() -> None:
    """What a server's histogram deltas between two scrapes hold: the requests that finished
    in the span (TPOT, E2E) and those whose first token came in it (TTFT), any phase."""
    records = [
        ok(T0 - 2.5, ttft=0.5, e2e=3.0, phase=PHASE_WARMUP),  # first token T0-2, ends T0+0.5
        ok(T0 + 1.0, ttft=0.1, e2e=1.0),  # first token and end in the span
        ok(T1 - 0.5, ttft=0.1, e2e=2.0),  # first token in the span, ends after it
        failed(T0 + 2.0, ERROR_TIMEOUT),  # not completed: out
    ]
    means = span_means(records, T0, T1)
    assert means["e2e"] == pytest.approx(2.0)  # (3.0 + 1.0) / 2
    assert means["ttft"] == pytest.approx(0.1)  # the second and third
    assert means["tpot"] == pytest.approx(((3.0 - 0.5) / 10 + (1.0 - 0.1) / 10) / 2)
    # the window's own mean (requests *sent* in it) is another population
    assert measure(records, T0, T1, NO_SLO).e2e.mean == pytest.approx(1.5)
    assert span_means(records, T1 + 5, T1 + 6) == {"ttft": None, "tpot": None, "e2e": None}
