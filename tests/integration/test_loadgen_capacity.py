"""A client that keeps up: the capacity probe on this host, and a trial whose token events
exceed what one client process carries, run against a fast streaming server with known delays.

The capacity that decides the trial's processes is stored in the test (a low one), so what is
asserted does not depend on how fast this host is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL
from tuner.cli import main
from tuner.loadgen import client_capacity as cap
from tuner.loadgen.client_capacity import ClientCapacity
from tuner.loadgen.probe import probe
from tuner.testing.sse_server import FakeConfig, FakeServer

pytestmark = pytest.mark.integration
KEY = "sk-capacity-test-4242"
USERS, ITL_S = 4, 0.005  # 200 token events/s per user: 800 for the client at most
STORED_EVENTS_S = 400.0  # what one process "carries": the first window exceeds it


@pytest.fixture()
def fake() -> Iterator[FakeServer]:
    config = FakeConfig(ttft_s=0.02, itl_s=ITL_S, api_key=KEY, model=str(TINY_MODEL))
    with FakeServer(config) as server:
        yield server


def test_the_probe_measures_events_per_cpu_second_of_one_process() -> None:
    found = probe(window_s=2.0, users=8)
    assert found.carried_events_per_s > 0 and 0 < found.cpu_cores <= 1.05
    # the capacity is the carried rate at a full core: never below what it carried
    assert found.events_per_s >= found.carried_events_per_s


def test_a_trial_past_one_process_runs_with_enough_and_is_not_client_saturated(
    fake: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    cap.store(ClientCapacity(events_per_s=STORED_EVENTS_S))
    rc = main(
        [
            "trial",
            "server=external",
            f"server.url={fake.url}/v1",
            f"studies_dir={tmp_path}",
            "name=cap",
            "quality.enabled=false",
            f"workload.concurrency={USERS}",
            "workload.warmup_s=1",
            "workload.window_s=3",
            "workload.drain_timeout_s=5",
            "server.startup_timeout_s=10",
            "--trial-id",
            "t",
        ]
    )
    folder = tmp_path / "cap" / "trials" / "t"
    result = json.loads((folder / "result.json").read_text())
    assert rc == 0, result.get("message")
    m = result["measurements"]
    # the first window, on one process, carried more than it can: set aside, never scored
    assert (folder / "loadgen-client-bound-1" / "requests.jsonl").exists()
    assert any("could not keep up" in w for w in m["warnings"])
    # the window that counts ran on enough processes, each within the stored capacity
    assert m["client_processes"] >= 2
    assert m["client_events_s"] / m["client_processes"] <= STORED_EVENTS_S
    spec = json.loads((folder / "loadgen" / "loadgen_spec.json").read_text())
    assert spec["processes"] == m["client_processes"]
    assert result["telemetry"]["client_saturated"] is False
    assert m["completed"] > 0 and m["error_rate"] == 0
