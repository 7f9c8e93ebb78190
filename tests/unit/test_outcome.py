"""A trial outcome is typed data that result.json carries and gives back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.config import SloConfig
from tuner.measurement.records import RequestRecord
from tuner.measurement.stats import measure
from tuner.quality import QualityResult
from tuner.schema import TrialStatus
from tuner.search.launch import LaunchSpec
from tuner.server import ServerInfo
from tuner.telemetry import TelemetrySummary
from tuner.trial.outcome import TrialOutcome, TrialPlacement, Window


def _outcome() -> TrialOutcome:
    records = [
        RequestRecord(
            request_id=str(i),
            request_class="short",
            api="completions",
            phase="measure",
            scheduled_at=100.0 + i,
            sent_at=100.0 + i,
            ok=True,
            status=200,
            ttft_s=0.05,
            e2e_s=0.5,
            output_tokens=16,
            done_at=100.5 + i,
        )
        for i in range(5)
    ]
    return TrialOutcome(
        trial_id="memory-3",
        status=TrialStatus.OK,
        argv=["python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "8"],
        launch=LaunchSpec(args={"max_num_seqs": 8}, env={"VLLM_CPU_KVCACHE_SPACE": "2"}, cpus=[0]),
        server=ServerInfo("http://127.0.0.1:8000", 4242, 31.5, kv_cache_tokens=2_097_152),
        measurements=measure(records, 100.0, 110.0, SloConfig()),
        telemetry=TelemetrySummary(process={"server_rss_max_mib": 900.0}, client_lagging=True),
        timings={"startup": 31.5, "total": 60.2},
        window=Window(100.0, 110.0),
        quality=QualityResult(outputs="q.jsonl", items=13, applies=True, drops={"x": 0.1}),
        placement=TrialPlacement((0,), (1,), [0], [1]),
        folder="studies/s/trials/memory-3",
    )


def test_result_json_round_trips(tmp_path: Path) -> None:
    outcome = _outcome()
    outcome.write(tmp_path / "result.json")
    again = TrialOutcome.read(tmp_path / "result.json")
    assert again == outcome and again.ok and again.metrics() is not None
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["status"] == "ok" and data["server"]["kv_cache_tokens"] == 2_097_152
    assert data["placement"]["server"] == [0] and data["window"] == {"start": 100.0, "end": 110.0}


def test_a_failed_outcome_keeps_its_reason_and_reads_back() -> None:
    outcome = TrialOutcome("b-0", TrialStatus.OK, [], LaunchSpec())
    outcome.fail("oom", "CUDA out of memory", "last line")
    again = TrialOutcome.from_dict(json.loads(json.dumps(outcome.to_dict())))
    assert again.status is TrialStatus.FAILED and not again.ok and again.reason == "oom"
    assert again.server is None and again.measurements is None and again.quality is None
