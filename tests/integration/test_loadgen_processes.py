"""Load beyond one client process: Locust's ``--processes`` mode, merged exactly.

Several processes are one client: the same t0, the one arrival schedule of an open loop split
between them, ``max_requests`` counted over all of them. Asserted against one process at the
same load, on a streaming server with known delays (tuner/testing/sse_server.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
from tuner.loadgen import LoadResult, LocustLoadGenerator, Target
from tuner.measurement.records import RequestRecord, read_records
from tuner.testing.sse_server import FakeConfig, FakeServer
from tuner.testing.tiny_tokenizer import make_tiny_tokenizer

pytestmark = pytest.mark.integration

TTFT, ITL, N_OUT = 0.05, 0.01, 8
KEY, MODEL = "sk-test", "fake-model"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer(FakeConfig(ttft_s=TTFT, itl_s=ITL, api_key=KEY, model=MODEL)) as server:
        yield server


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    real = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
    if (real / "tokenizer.json").exists():
        return str(real)
    return str(make_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def _workload(**kw: Any) -> WorkloadConfig:
    out = LengthDist(mean=N_OUT)
    classes = [
        RequestClass(name="comp", prompt_tokens=LengthDist(mean=32), output_tokens=out),
        RequestClass(name="chat", api="chat", prompt_tokens=LengthDist(mean=24), output_tokens=out),
    ]
    base: dict[str, Any] = {"classes": classes, "request_timeout_s": 10.0, "seed": 3}
    return WorkloadConfig(**{**base, "drain_timeout_s": 5.0, "warmup_s": 1.0, **kw})


class Run:
    """One load run: its result, its records and each process's run-info."""

    def __init__(self, fake: FakeServer, tok: str, out: Path, workload: WorkloadConfig) -> None:
        target = Target(base_url=fake.url, api_key=KEY, model=MODEL, tokenizer=tok)
        self.result: LoadResult = LocustLoadGenerator().run(target, workload, out)
        self.records: list[RequestRecord] = list(read_records(self.result.records_path))
        self.infos = [json.loads(p.read_text()) for p in out.glob("records-*.run.json")]

    @property
    def t0(self) -> float:
        (t0,) = {i["t0"] for i in self.infos}  # one t0 for every process
        return float(t0)

    def measured(self) -> list[RequestRecord]:
        start, end = self.result.window_start, self.result.window_end
        return [r for r in self.records if r.phase == "measure" and start <= r.sent_at < end]

    def schedule(self) -> list[tuple[float, str, int]]:
        """Each measured request's scheduled instant after t0, with what it asked."""
        return sorted(
            (round(r.scheduled_at - self.t0, 6), r.request_class, r.max_tokens)
            for r in self.records
            if r.phase == "measure"
        )

    def senders(self) -> set[str]:
        return {r.request_id.split("-")[0] for r in self.records}


def test_an_open_loop_in_three_processes_sends_the_one_process_schedule(
    fake: FakeServer, tok_dir: str, tmp_path: Path
) -> None:
    workload = dict(mode="open", rate=24.0, burstiness=1.0, window_s=3.0)
    one = Run(fake, tok_dir, tmp_path / "one", _workload(**workload, processes=1))
    three = Run(fake, tok_dir, tmp_path / "three", _workload(**workload, processes=3))
    assert len(three.infos) == 3 and len(three.senders()) == 3  # every process sent its share
    # The same arrivals at the same instants after t0, each asking the same plan entry
    assert three.schedule() == one.schedule() and len(one.schedule()) > 40
    assert three.result.window_start - three.t0 == pytest.approx(1.0)
    assert three.result.window_end - three.result.window_start == pytest.approx(3.0, abs=0.01)
    assert len(three.measured()) == len(one.measured())
    assert three.result.measured_requests == one.result.measured_requests
    for metric in ("ttft_s", "e2e_s"):
        a = [getattr(r, metric) for r in one.measured() if r.ok]
        b = [getattr(r, metric) for r in three.measured() if r.ok]
        # The server's delays are fixed: the medians agree. The tails hold the host too: three
        # Locust processes and the server on 2 shared cores put one P99 at 0.156 s against
        # 0.123 (a CI run), so theirs is a looser bound.
        assert np.percentile(b, 50) == pytest.approx(np.percentile(a, 50), abs=0.015)
        assert np.percentile(b, 99) == pytest.approx(np.percentile(a, 99), abs=0.06)


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_max_requests_counts_the_whole_client(
    mode: str, fake: FakeServer, tok_dir: str, tmp_path: Path
) -> None:
    """Shares of a limit that does not divide by the processes (23 over 3) add up to it."""
    load = {"rate": 40.0} if mode == "open" else {"concurrency": 4}
    workload = _workload(mode=mode, window_s=20.0, max_requests=23, **load)
    one = Run(fake, tok_dir, tmp_path / "one", workload)
    three = Run(
        fake,
        tok_dir,
        tmp_path / "three",
        _workload(mode=mode, window_s=20.0, max_requests=23, processes=3, **load),
    )
    for run in (one, three):
        assert len(run.measured()) == run.result.measured_requests == 23
        assert run.result.window_end - run.result.window_start < 10.0  # ended by the count
    if mode == "open":  # the very same first 23 measured arrivals
        assert three.schedule() == one.schedule()
