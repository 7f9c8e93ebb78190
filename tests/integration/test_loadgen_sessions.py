"""Multi-turn conversations through the real Locust client, against the fake streaming server:
a user sends a conversation's turns one after another, each a think time after the previous
answer, with prompts that grow by the answer and the new part; an open loop's arrival opens a
conversation."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tuner.config.workload import LengthDist, RequestClass, SessionConfig, WorkloadConfig
from tuner.loadgen import LocustLoadGenerator, Target
from tuner.measurement.records import RequestRecord, read_records
from tuner.testing.sse_server import FakeConfig, FakeServer

pytestmark = pytest.mark.integration

TTFT, ITL, N_OUT, NEW = 0.05, 0.01, 8, 24
THINK = 0.4
TURNS = 3


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer(FakeConfig(ttft_s=TTFT, itl_s=ITL)) as server:
        yield server


def _run(fake: FakeServer, tok: Path, out: Path, **kw: object) -> list[RequestRecord]:
    cls = RequestClass(prompt_tokens=LengthDist(mean=NEW), output_tokens=LengthDist(mean=N_OUT))
    workload = WorkloadConfig(
        classes=[cls],
        sessions=SessionConfig(turns=TURNS, think_s=THINK, think="fixed"),
        warmup_s=0.5,
        window_s=4.0,
        drain_timeout_s=5.0,
        request_timeout_s=10.0,
        **kw,  # type: ignore[arg-type]
    )
    workload.validate()
    target = Target(base_url=fake.url, api_key=None, model="fake", tokenizer=str(tok))
    result = LocustLoadGenerator().run(target, workload, out)
    assert result.returncode == 0
    return list(read_records(result.records_path))


def _conversations(records: list[RequestRecord], key: str) -> list[list[RequestRecord]]:
    """Each sender's records in send order, cut where a new conversation starts (turn 0)."""
    talks: list[list[RequestRecord]] = []
    ordered = sorted(records, key=lambda r: (getattr(r, key), r.sent_at))
    for _, mine in itertools.groupby(ordered, key=lambda r: getattr(r, key)):
        for r in mine:
            if r.turn == 0 or not talks:
                talks.append([])
            talks[-1].append(r)
    return talks


def test_a_closed_loop_user_holds_a_conversation_with_think_times(
    fake: FakeServer, tiny_model: Path, tmp_path: Path
) -> None:
    records = _run(fake, tiny_model, tmp_path, mode="closed", concurrency=3)
    assert all(r.ok for r in records)
    talks = _conversations(records, "user")
    whole = [t for t in talks if len(t) == TURNS]
    assert len(whole) >= 3
    for talk in talks:
        assert [r.turn for r in talk] == list(range(len(talk)))  # in order, none skipped
        # the prompt grows by the answer and the new part (the fake counts words)
        grew = [b.prompt_tokens - a.prompt_tokens for a, b in itertools.pairwise(talk)]  # type: ignore[operator]
        assert all(g == pytest.approx(N_OUT + NEW, abs=2) for g in grew), grew
        for a, b in itertools.pairwise(talk):
            assert a.done_at is not None and b.sent_at - a.done_at >= THINK
    thinks = [b.sent_at - a.done_at for t in talks for a, b in itertools.pairwise(t)]  # type: ignore[operator]
    assert np.median(thinks) < THINK + 0.05
    # a user opens its next conversation at once: no think time before a first turn
    by_user = sorted(records, key=lambda r: (r.user, r.sent_at))
    opens = [
        b.sent_at - a.done_at  # type: ignore[operator]
        for a, b in itertools.pairwise(by_user)
        if a.user == b.user and b.turn == 0
    ]
    assert opens and np.median(opens) < 0.05


def test_an_open_loop_arrival_opens_a_conversation(
    fake: FakeServer, tiny_model: Path, tmp_path: Path
) -> None:
    records = _run(fake, tiny_model, tmp_path, mode="open", rate=2.0)
    assert all(r.ok for r in records)
    firsts = sorted(r.sent_at for r in records if r.turn == 0)
    assert len(firsts) >= 4  # ~9 arrivals in 4.5 s at 2 a second
    assert sum(r.turn > 0 for r in records) >= len(firsts)  # their follow-up turns came too
    lag = [r.sent_at - r.scheduled_at for r in records if r.turn == 0]
    assert max(lag) < 0.05  # first turns keep the arrival schedule
