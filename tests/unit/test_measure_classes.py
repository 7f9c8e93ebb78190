"""A window measured per request class: each class's own stats, the totals unchanged, and the
per-class block through result.json and the storage's attrs (old files without it still read)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tuner.config import SloConfig
from tuner.measurement.records import ERROR_TIMEOUT, PHASE_MEASURE, PHASE_WARMUP, RequestRecord
from tuner.measurement.stats import ClassStats, Measurements, measure
from tuner.schema import CLASS_METRIC_PREFIX, TrialStatus, class_metric_attr, metric_attr
from tuner.search.launch import LaunchSpec
from tuner.study.decision.evaluation import Evaluated
from tuner.trial.outcome import TrialOutcome

T0, T1 = 1_000.0, 1_010.0  # a 10 s window
SLO = SloConfig(p99_e2e_s=1.0)
CHAT_E2E = [0.1 + 0.01 * i for i in range(40)]  # 0.10 .. 0.49 s: every one meets the SLO
BATCH_E2E = [2.0 + 0.1 * i for i in range(20)]  # 2.0 .. 3.9 s: none meets it


def _rec(i: int, cls: str, e2e: float | None, phase: str = PHASE_MEASURE) -> RequestRecord:
    done = e2e is not None
    return RequestRecord(
        request_id=f"{cls}{i}",
        request_class=cls,
        api="completions",
        phase=phase,
        scheduled_at=T0 + 0.1 * i,
        sent_at=T0 + 0.1 * i,
        ok=done,
        ttft_s=e2e / 10 if e2e is not None else None,
        e2e_s=e2e,
        prompt_tokens=100 if done else None,
        output_tokens=11 if done else None,
        error_kind="" if done else ERROR_TIMEOUT,
    )


def _records() -> list[RequestRecord]:
    chat = [_rec(i, "chat", e) for i, e in enumerate(CHAT_E2E)]
    batch = [_rec(i, "batch", e) for i, e in enumerate(BATCH_E2E)]
    broken = [_rec(i, "broken", None) for i in range(3)]
    # A warm-up request is in no class's window, as it is in no total.
    return chat + batch + broken + [_rec(0, "chat", 99.0, phase=PHASE_WARMUP)]


def _classless(m: Measurements) -> dict[str, object]:
    data = m.to_dict()
    del data["by_class"]
    return data


def test_each_class_has_its_own_stats_and_the_totals_are_unchanged() -> None:
    recs = _records()
    m = measure(recs, T0, T1, SLO)
    assert list(m.by_class) == ["batch", "broken", "chat"]
    chat, batch = m.by_class["chat"], m.by_class["batch"]
    assert chat.e2e.p99 == pytest.approx(float(np.percentile(CHAT_E2E, 99)))
    assert batch.e2e.p99 == pytest.approx(float(np.percentile(BATCH_E2E, 99)))
    assert chat.ttft.p50 == pytest.approx(float(np.percentile(CHAT_E2E, 50)) / 10)
    assert (chat.completed, chat.failed, chat.error_rate) == (40, 0, 0.0)
    assert chat.output_throughput == pytest.approx(40 * 11 / 10)
    assert chat.goodput == pytest.approx(4.0) and batch.goodput == 0.0
    # The totals are what they were: the same window measured without the classes' names.
    alike = [RequestRecord(**{**vars(r), "request_class": "default"}) for r in recs]
    assert _classless(m) == _classless(measure(alike, T0, T1, SLO))
    assert m.e2e.p99 == pytest.approx(float(np.percentile(CHAT_E2E + BATCH_E2E, 99)))


def test_a_class_of_only_failures_has_error_rate_one_and_no_latency() -> None:
    broken = measure(_records(), T0, T1, SLO).by_class["broken"]
    assert (broken.requests_started, broken.completed, broken.failed) == (3, 0, 3)
    assert broken.error_rate == 1.0 and broken.goodput == 0.0
    assert broken.e2e.p99 is None and broken.ttft.n == 0 and broken.tpot.p50 is None
    assert math.isnan(broken.flat()["e2e_p99_s"])


def test_a_workload_of_one_class_has_its_one_entry() -> None:
    m = measure([_rec(i, "default", e) for i, e in enumerate(CHAT_E2E)], T0, T1, SLO)
    assert list(m.by_class) == ["default"]
    only = m.by_class["default"]
    assert (only.e2e, only.ttft, only.tpot) == (m.e2e, m.ttft, m.tpot)
    assert only.output_throughput == m.output_throughput and only.goodput == m.goodput


def test_result_json_carries_the_classes_and_reads_old_files(tmp_path: Path) -> None:
    m = measure(_records(), T0, T1, SLO)
    outcome = TrialOutcome("t-1", TrialStatus.OK, ["vllm"], LaunchSpec(), measurements=m)
    path = tmp_path / "result.json"
    outcome.write(path)
    json.loads(path.read_text(), parse_constant=_no_nan)  # strict JSON: no NaN
    again = TrialOutcome.read(path)
    assert again == outcome and again.measurements is not None
    assert isinstance(again.measurements.by_class["broken"], ClassStats)
    # A result.json from before classes were measured: no by_class block at all.
    old = json.loads(path.read_text())
    del old["measurements"]["by_class"]
    path.write_text(json.dumps(old))
    before = TrialOutcome.read(path).measurements
    assert before is not None and before.by_class == {} and before.e2e == m.e2e


def _no_nan(name: str) -> float:
    raise AssertionError(f"{name} in result.json")


def test_storage_attrs_per_class_only_where_finite() -> None:
    m = measure(_records(), T0, T1, SLO)
    outcome = TrialOutcome("t-1", TrialStatus.OK, ["vllm"], LaunchSpec(), measurements=m)
    attrs = Evaluated(outcome, [], {}, []).user_attrs("memory", "search", {}, LaunchSpec())
    assert class_metric_attr("chat", "ttft_p99_s") == "m_class_chat_ttft_p99_s"
    assert attrs["m_class_chat_e2e_p99_s"] == m.by_class["chat"].e2e.p99
    assert attrs["m_class_batch_goodput_req_s"] == 0.0
    assert attrs["m_class_broken_error_rate"] == 1.0 and attrs["m_class_broken_failed"] == 3.0
    assert "m_class_broken_e2e_p99_s" not in attrs  # no latency: no column, never "nan"
    classes = {k: v for k, v in attrs.items() if k.startswith(CLASS_METRIC_PREFIX)}
    assert all(isinstance(v, float) and math.isfinite(v) for v in classes.values())
    # The totals' attrs are exactly the flat totals.
    totals = {k: v for k, v in attrs.items() if k.startswith("m_") and k not in classes}
    assert set(totals) == {metric_attr(k) for k in m.flat()}
