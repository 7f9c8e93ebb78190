"""The capacity search with real Locust against a streaming server of known capacity: it serves 4
requests at a time for 0.4 s each, so it completes at most N = 10 requests/s and queues beyond
that. The rate found must be within 10 % of N."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL, leftover_processes
from tests.fakes.queue_server import QueueServer
from tuner.config import SloConfig
from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
from tuner.deployment.capacity.rate_load import measure_rate, rate_workload
from tuner.deployment.capacity.sweep import CapacitySearch
from tuner.loadgen import Target
from tuner.plan.sizing import CapacityStep
from tuner.testing.sse_server import FakeConfig

pytestmark = pytest.mark.integration
OUT_TOKENS = 16
# Service time 0.1 + 15 x 0.02 = 0.4 s; waiting 0.2 s more breaks the SLO. Below N nearly
# regular arrivals (gamma shape 50) never wait; above it the queue grows by (rate - N) per
# second, so 5 % over N for the 5 s of warm-up and window already waits 0.25 s at the end.
SLO = SloConfig(p99_e2e_s=0.6, max_error_rate=0.01)


@pytest.fixture(scope="module")
def server() -> Iterator[QueueServer]:
    with QueueServer(FakeConfig(ttft_s=0.1, itl_s=0.02), slots=4) as fake:
        yield fake


def _workload() -> WorkloadConfig:
    mix = RequestClass(prompt_tokens=LengthDist(mean=32), output_tokens=LengthDist(mean=OUT_TOKENS))
    return WorkloadConfig(
        classes=[mix],
        burstiness=50.0,
        warmup_s=1.0,
        window_s=4.0,
        request_timeout_s=10.0,
        drain_timeout_s=10.0,
        seed=3,
    )


def test_the_search_finds_a_known_capacity(server: QueueServer, tmp_path: Path) -> None:
    capacity = server.capacity(OUT_TOKENS)
    assert capacity == pytest.approx(10.0)
    target = Target(base_url=server.url, api_key=None, model="fake", tokenizer=str(TINY_MODEL))
    steps: list[CapacityStep] = []

    def measure(rate: float, phase: str) -> CapacityStep:
        out = tmp_path / f"{len(steps):02d}"
        step = measure_rate(target, rate_workload(_workload(), rate, None), SLO, out, phase)
        steps.append(step)
        return step

    lines: list[str] = []
    found = CapacitySearch(measure, 6.0, max_steps=8, resolution=0.1, progress=lines.append).run()
    assert abs(found.max_rps - capacity) <= 0.1 * capacity, (found, lines)
    assert found.max_rps < found.upper_rps <= 1.5 * capacity
    over = [s for s in steps if s.offered_rps > 1.15 * capacity]
    assert over and all(not s.meets and "P99 E2E" in s.why for s in over)  # it really queued
    under = [s for s in steps if s.offered_rps < 0.85 * capacity]
    assert under and all(s.meets for s in under)
    assert all(s.sent_rps >= 0.8 * s.offered_rps for s in steps)  # the client kept up
    assert leftover_processes(str(tmp_path)) == []
