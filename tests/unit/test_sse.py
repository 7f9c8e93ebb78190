"""SSE parsing as `vllm bench serve` does it: which events carry tokens, and the timings."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tuner.loadgen.sse import is_token_event, read_stream
from tuner.measurement.records import RequestRecord


def _rec() -> RequestRecord:
    return RequestRecord("r", "c", "chat", "measure", 0.0, 0.0, ok=True)


def _chunk(**delta: object) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": delta}]}).encode()


def _timed(lines: list[bytes], gap_s: float) -> Iterator[bytes]:
    for line in lines:
        time.sleep(gap_s)
        yield line


def test_role_only_chunk_usage_chunk_and_keepalive_are_not_tokens() -> None:
    assert not is_token_event({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, True)
    assert not is_token_event({"choices": [], "usage": {"completion_tokens": 3}}, True)
    assert is_token_event({"choices": [{"delta": {"content": "x"}}]}, True)
    assert is_token_event({"choices": [{"text": "x"}]}, False)


def test_chat_stream_timings_and_usage() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    lines = [
        _chunk(role="assistant", content=""),
        b": keep-alive",
        b"",
        _chunk(content="a"),
        _chunk(content="b"),
        _chunk(content="c"),
        b"data: " + json.dumps(usage).encode(),
        b"data: [DONE]",
    ]
    rec, t0 = _rec(), time.perf_counter()
    read_stream(_timed(lines, 0.01), rec, t0, chat=True)
    assert rec.prompt_tokens == 7 and rec.output_tokens == 3
    assert len(rec.itl_s) == 2  # three token events, two gaps
    assert rec.ttft_s is not None and rec.e2e_s is not None
    assert 0.035 <= rec.ttft_s < rec.e2e_s  # role chunk and keep-alive did not count
    assert rec.e2e_s == pytest.approx(rec.ttft_s + sum(rec.itl_s), abs=1e-6)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_chunk(content="a")], r"without \[DONE\]"),
        ([b"data: [DONE]"], "no token"),
        ([b'data: {"error": {"message": "boom"}}'], "error event"),
    ],
)
def test_malformed_streams_raise(lines: list[bytes], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_stream(iter(lines), _rec(), time.perf_counter(), chat=True)
