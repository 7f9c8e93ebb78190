"""One request of vLLM's OpenAI-compatible API: the HTTP request built from a plan entry, and
its answer read into a record, a failure classified.

No gevent and no Locust, so the locustfile's subprocess and the unit tests import it alike; the
locustfile adds the clock, the deadline and the run's state around it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import requests
from urllib3.exceptions import ReadTimeoutError

from tuner.loadgen.sse import ERROR_TEXT_MAX, read_stream
from tuner.measurement.records import (
    ERROR_HTTP,
    ERROR_REJECTED,
    ERROR_STREAM,
    ERROR_TIMEOUT,
    RequestRecord,
)

# What a broken or malformed answer raises while we read it (bad JSON, odd shapes, cut streams).
MALFORMED = (requests.exceptions.RequestException, ValueError, TypeError, KeyError, AttributeError)
# vLLM's answers (HTTP 400) to a request that does not fit its max_model_len, from vLLM 0.32:
# - the prompt is longer than the context, counted in tokens or, before tokenizing, bounded in
#   characters (vllm/renderers/params.py, _token_len_check and _text_len_check: "This model's
#   maximum context length is 512 tokens. However, your prompt contains ..."); the same words
#   begin older vLLMs' prompt + max_tokens refusal and get_max_tokens's ("Input length (600)
#   exceeds model's maximum context length (512).", vllm/entrypoints/serve/utils/api_utils.py);
# - max_tokens alone exceeds it (TokenizeParams.__post_init__: "max_tokens=600 cannot be
#   greater than max_model_len=512. ...", max_completion_tokens on chat alike);
# - the prompt fills it exactly: get_max_tokens leaves 0 output tokens, which SamplingParams
#   refuses ("max_tokens must be at least 1, got 0.", vllm/sampling_params.py); the client
#   never sends 0, so that 0 is the server's.
CONTEXT_REFUSAL = re.compile(
    r"maximum context length|cannot be greater than max_model_len"
    r"|max_(?:completion_)?tokens must be at least 1, got 0\b",
    re.IGNORECASE,
)
# A prompt that fits with fewer output tokens than asked is served, not refused: vLLM 0.32
# lowers max_tokens to max_model_len - prompt (get_max_tokens) and ends the stream with
# finish_reason "length" short of max_tokens. The client asks ignore_eos, so such an answer
# only comes from a context too short for the request: rejected as well, never a clipped
# latency sample.
LENGTH = "length"


def body(entry: dict[str, Any], model: str) -> dict[str, Any]:
    """The JSON body of a plan entry: streamed, with usage, exactly the asked output length."""
    out: dict[str, Any] = {
        "model": model,
        "max_tokens": entry["max_tokens"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # random-weight and real models alike: the asked length, always
    }
    if entry.get("priority"):  # the plan keeps it only for a server that schedules by it
        out["priority"] = entry["priority"]
    if entry["api"] == "chat":
        out["messages"] = entry["messages"]
    else:
        out["prompt"] = entry["prompt"]
    return out


def prepare(
    session: requests.Session,
    entry: dict[str, Any],
    model: str,
    base_url: str,
    api_key: str | None,
) -> requests.PreparedRequest:
    """The HTTP request for a plan entry. Built before the clock starts: client work, not
    latency. (requests' own prepare: HttpSession's override needs state its request() sets.)"""
    path = "/v1/chat/completions" if entry["api"] == "chat" else "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body(entry, model)).encode()
    request = requests.Request("POST", base_url + path, data=data, headers=headers)
    return requests.Session.prepare_request(session, request)


def fail(rec: RequestRecord, kind: str, error: str) -> None:
    """Mark ``rec`` failed: no latencies, the error kept short."""
    rec.ok = False
    rec.error_kind = kind
    rec.error = error[:ERROR_TEXT_MAX]
    rec.ttft_s = rec.e2e_s = None
    rec.itl_s = []


def refused_context(status: int, text: str) -> bool:
    """Whether an answer is the server's refusal of a request too long for its context."""
    return 400 <= status < 500 and CONTEXT_REFUSAL.search(text) is not None


def clipped(rec: RequestRecord, finish_reason: str | None) -> bool:
    """Whether a 200's stream ended at the context's end before the asked output length."""
    asked, got = rec.max_tokens, rec.output_tokens
    return finish_reason == LENGTH and asked is not None and got is not None and got < asked


def consume(resp: requests.Response, rec: RequestRecord, t_send: float, chat: bool) -> None:
    """Read the answer and classify a failure (the caller bounds the total time)."""
    rec.status = resp.status_code
    try:
        if rec.status != 200:
            text = f"HTTP {rec.status}: {resp.content.decode('utf-8', 'replace')}"
            fail(rec, ERROR_REJECTED if refused_context(rec.status, text) else ERROR_HTTP, text)
            return
        finish = read_stream(resp.iter_lines(), rec, t_send, chat)
        if clipped(rec, finish):
            fail(
                rec,
                ERROR_REJECTED,
                f"HTTP 200, finish_reason {finish!r} after {rec.output_tokens} of "
                f"{rec.max_tokens} output tokens (prompt {rec.prompt_tokens} tokens): the "
                "server's max_model_len cut the answer short",
            )
    except requests.exceptions.ConnectionError as exc:
        timeout = isinstance(exc.args[0] if exc.args else None, ReadTimeoutError)
        fail(rec, ERROR_TIMEOUT if timeout else ERROR_STREAM, f"after HTTP {rec.status}: {exc!r}")
    except MALFORMED as exc:
        text = f"after HTTP {rec.status}: {exc!r}"
        # an error event in the stream that says the same (a server that validates late)
        kind = ERROR_REJECTED if CONTEXT_REFUSAL.search(text) else ERROR_STREAM
        fail(rec, kind, text)
