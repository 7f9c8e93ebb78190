"""Server-sent events of vLLM's OpenAI-compatible streaming API, read the way `vllm bench serve`
reads them: TTFT at the first token-bearing event, E2E at the last one, ITL between them.

Pure functions (no gevent, no Locust), so they are unit-tested directly; the locustfile feeds
them ``response.iter_lines()``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from tuner.measurement.records import RequestRecord

ERROR_TEXT_MAX = 500


_CHAT_OUTPUT_KEYS = ("content", "reasoning_content", "reasoning")


def is_token_event(event: dict[str, Any], chat: bool) -> bool:
    """Whether an SSE event carries generated output (as `vllm bench serve` counts them)."""
    choices = event.get("choices") or []
    if not choices:
        return False  # the usage chunk
    if not chat:
        return isinstance(choices[0].get("text"), str)
    delta = choices[0].get("delta") or {}
    if "role" in delta and not any(delta.get(k) for k in _CHAT_OUTPUT_KEYS):
        return False  # vLLM's role-only first chat chunk
    return any(isinstance(delta.get(k), str) for k in _CHAT_OUTPUT_KEYS)


def read_stream(
    lines: Iterable[bytes], rec: RequestRecord, t_send: float, chat: bool
) -> str | None:
    """Fill timing and usage fields from the SSE stream; raise on a malformed stream. Returns
    the stream's finish_reason ("length", "stop", ...; None where no event said one)."""
    last: float | None = None
    done = False
    finish: str | None = None
    for raw in lines:
        if not raw or raw.startswith(b":") or not raw.startswith(b"data:"):
            continue  # blank separators, `: keep-alive` comments, other SSE fields
        data = raw[5:].strip()
        if data == b"[DONE]" or done:
            # Read on to the end of the body: a response closed unread also closes its
            # connection, and the next request would pay for a new one inside its TTFT.
            done = True
            continue
        event = json.loads(data)
        if "error" in event and not event.get("choices"):
            raise ValueError(f"error event: {json.dumps(event['error'])[:ERROR_TEXT_MAX]}")
        if (choices := event.get("choices")) and (reason := choices[0].get("finish_reason")):
            finish = str(reason)
        if usage := event.get("usage"):
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.output_tokens = usage.get("completion_tokens")
        if is_token_event(event, chat):
            now = time.perf_counter()
            if last is None:
                rec.ttft_s = now - t_send
            else:
                rec.itl_s.append(now - last)
            last = now
    if not done or last is None:
        raise ValueError("stream ended without [DONE]" if not done else "no token in the stream")
    rec.e2e_s = last - t_send
    return finish
