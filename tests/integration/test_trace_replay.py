"""A window of the shipped Azure trace replayed by the real locustfile against a streaming server:
every request of the window is sent once, at its trace time (rescaled), with its exact output
length; late sends are counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tuner.config import SloConfig
from tuner.config.workload import TraceConfig, WorkloadConfig
from tuner.loadgen import LocustLoadGenerator, Target
from tuner.measurement.records import read_records
from tuner.measurement.stats import DISPATCH_LAG_WARN_S, measure
from tuner.testing.sse_server import FakeConfig, FakeServer
from tuner.traffic.trace import TraceOptions, load

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "conf" / "workload" / "traces" / "azure_code_2023_sample.csv"
START_S, SCALE, MAX_LEN = 190.0, 2.0, 2048


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


def test_a_trace_window_is_replayed_at_its_times_with_its_lengths(
    fake: FakeServer, tiny_model: Path, tmp_path: Path, no_leftovers: None
) -> None:
    fake.reset(FakeConfig(ttft_s=0.02, itl_s=0.001))
    trace = TraceConfig(str(SAMPLE), start_s=START_S, rate_scale=SCALE, max_model_len=MAX_LEN)
    workload = WorkloadConfig(
        mode="open", warmup_s=0.5, window_s=4.0, drain_timeout_s=20.0, trace=trace
    )
    workload.validate()
    expected = load(SAMPLE, TraceOptions(START_S, 4.5 * SCALE, SCALE, MAX_LEN))
    assert len(expected) > 50

    target = Target(base_url=fake.url, api_key=None, model="m", tokenizer=str(tiny_model))
    result = LocustLoadGenerator().run(target, workload, tmp_path, on_spawn=lambda _pid: None)
    records = sorted(read_records(result.records_path), key=lambda r: r.scheduled_at)

    assert len(records) == len(expected) and all(r.ok for r in records)
    sched = np.array([r.scheduled_at for r in records])
    # the schedule is the trace's, on the replay clock (computed, not measured: exact)
    np.testing.assert_allclose(
        sched - sched[0], expected.arrivals - expected.arrivals[0], atol=1e-6
    )
    assert [r.max_tokens for r in records] == expected.output_tokens.tolist()
    assert [r.output_tokens for r in records] == expected.output_tokens.tolist()

    m = measure(records, result.window_start, result.window_end, SloConfig())
    in_window = [r for r in records if result.window_start <= r.sent_at < result.window_end]
    late = sum(1 for r in in_window if r.sent_at - r.scheduled_at > DISPATCH_LAG_WARN_S)
    assert m.late_sends == late
    assert m.flat()["late_sends"] == float(late)


def test_each_record_of_a_classed_replay_has_the_traces_class(
    fake: FakeServer, tiny_model: Path, tmp_path: Path, no_leftovers: None
) -> None:
    """A rule on prompt length classes the replay: every record's request_class is its
    request's class in the trace, and the measurements split by it."""
    from tuner.config.workload import RequestClass, TraceClass

    fake.reset(FakeConfig(ttft_s=0.02, itl_s=0.001))
    rule = [TraceClass("chat", 1024), TraceClass("documents")]
    trace = TraceConfig(
        str(SAMPLE), start_s=START_S, rate_scale=SCALE, max_model_len=MAX_LEN, classes=rule
    )
    classes = [RequestClass(name="chat"), RequestClass(name="documents", priority=10)]
    workload = WorkloadConfig(
        classes=classes, mode="open", warmup_s=0.5, window_s=2.0, drain_timeout_s=20.0, trace=trace
    )
    workload.validate()
    expected = load(SAMPLE, TraceOptions(START_S, 2.5 * SCALE, SCALE, MAX_LEN))
    recorded = load(SAMPLE, TraceOptions(START_S, 2.5 * SCALE, SCALE))  # lengths before the cap
    want = ["chat" if p <= 1024 else "documents" for p in recorded.prompt_tokens]
    assert {"chat", "documents"} <= set(want)

    target = Target(base_url=fake.url, api_key=None, model="m", tokenizer=str(tiny_model))
    result = LocustLoadGenerator().run(target, workload, tmp_path, on_spawn=lambda _pid: None)
    records = sorted(read_records(result.records_path), key=lambda r: r.scheduled_at)
    assert len(records) == len(expected) and all(r.ok for r in records)
    assert [r.request_class for r in records] == want
    m = measure(records, result.window_start, result.window_end, SloConfig())
    assert set(m.by_class) <= {"chat", "documents"} and m.by_class
