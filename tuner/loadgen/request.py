"""One request of vLLM's OpenAI-compatible API: the HTTP request built from a plan entry, and
its answer read into a record, a failure classified.

No gevent and no Locust, so the locustfile's subprocess and the unit tests import it alike; the
locustfile adds the clock, the deadline and the run's state around it.
"""

from __future__ import annotations

import json
from typing import Any

import requests
from urllib3.exceptions import ReadTimeoutError

from tuner.loadgen.sse import ERROR_TEXT_MAX, read_stream
from tuner.measurement.records import ERROR_HTTP, ERROR_STREAM, ERROR_TIMEOUT, RequestRecord

# What a broken or malformed answer raises while we read it (bad JSON, odd shapes, cut streams).
MALFORMED = (requests.exceptions.RequestException, ValueError, TypeError, KeyError, AttributeError)


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


def consume(resp: requests.Response, rec: RequestRecord, t_send: float, chat: bool) -> None:
    """Read the answer and classify a failure (the caller bounds the total time)."""
    rec.status = resp.status_code
    try:
        if rec.status != 200:
            fail(rec, ERROR_HTTP, f"HTTP {rec.status}: {resp.content.decode('utf-8', 'replace')}")
            return
        read_stream(resp.iter_lines(), rec, t_send, chat)
    except requests.exceptions.ConnectionError as exc:
        timeout = isinstance(exc.args[0] if exc.args else None, ReadTimeoutError)
        fail(rec, ERROR_TIMEOUT if timeout else ERROR_STREAM, f"after HTTP {rec.status}: {exc!r}")
    except MALFORMED as exc:
        fail(rec, ERROR_STREAM, f"after HTTP {rec.status}: {exc!r}")
