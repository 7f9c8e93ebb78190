"""A small, real OpenAI-compatible streaming server with known delays, for load-generator tests.

It speaks HTTP/1.1 with chunked transfer encoding and ``TCP_NODELAY`` like vLLM's uvicorn, and
streams SSE chunks shaped like vLLM 0.3x's: for chat a role-only first chunk, then one chunk per
token (the last one with ``finish_reason``), a ``usage`` chunk when
``stream_options.include_usage`` is set, then ``data: [DONE]``. Token ``i`` (0-based) is written at
``arrival + ttft + i * itl`` on an absolute schedule, so a late wake-up does not shift the rest;
the server also records the delays it really achieved (:attr:`FakeServer.timings`).

Fault injection (deterministic, by arrival order, 1-based): every ``fail_every``-th request gets
503; every ``drop_every``-th request has its connection closed after ``drop_after`` tokens;
every ``slow_every``-th request takes ``slow_factor`` times its delays (a tail of known size).

A regression of known size is then a setting, not a guess: ``factor`` multiplies every request's
delays (``factor=1.5`` streams each 1.5 times as long, so a closed loop serves 1/1.5 of the
tokens), while ``slow_every=10, slow_factor=2`` doubles the slowest tenth (the P99 doubles, the
throughput hardly moves). A real host is not that steady: ``drift_sd`` multiplies every delay by
a factor drawn afresh each ``drift_period_s`` (lognormal, seeded by the period), so windows
differ as a busy host's do, by about ``drift_sd / sqrt(window_s / drift_period_s)``.

Run standalone: ``python -m tuner.testing.sse_server --port 8123 --ttft 0.2 --itl 0.02``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_WORDS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta")


@dataclass
class FakeConfig:
    """Behaviour of the fake server; mutable between runs (read per request)."""

    ttft_s: float = 0.2
    itl_s: float = 0.02
    api_key: str | None = None  # None: no auth; else `Authorization: Bearer <key>` or 401
    model: str | None = None  # None: any model name; else others get 404 like vLLM
    default_max_tokens: int = 16
    fail_every: int = 0
    drop_every: int = 0
    drop_after: int = 2
    keepalive_comments: bool = True  # send `: ping` lines, which clients must skip
    slow_every: int = 0
    slow_factor: float = 1.0
    factor: float = 1.0  # every request's delays times this (a slowdown of known size)
    drift_sd: float = 0.0  # the sd of log(the host's slowdown); 0: a steady host
    drift_period_s: float = 1.0  # how long one drawn slowdown lasts


@dataclass
class Timing:
    """What the server really did for one streamed request (perf_counter deltas, s)."""

    first_token_s: float
    gaps_s: list[float] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that exits with idle keep-alive connections resets them: not a server error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    scale = 1.0  # this request's delays over the configured ones (tail, slowdown, drift)
    # The config and timings list this request arrived under: a request still streaming when
    # a test resets the server keeps its old delays and must not land in the next run's timings.
    cfg: FakeConfig
    timings: list[Timing]

    def setup(self) -> None:
        super().setup()
        # Without NODELAY, Nagle + delayed ACKs would hold small token chunks back (~40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read records
        return

    @property
    def fake(self) -> FakeServer:
        return self.server.fake

    # ------------------------------------------------------------------ plumbing
    def _send_json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_text(self, status: int, text: str, ctype: str = "text/plain") -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        err = {"message": message, "type": "error", "code": status}
        self._send_json(status, {"object": "error", "error": err, **err})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    # ------------------------------------------------------------------ GET
    def do_GET(self) -> None:
        if self.path == "/health":
            self._send_text(200, "")
        elif self.path == "/metrics":
            self._send_text(200, self.fake.metrics_text(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            name = self.fake.config.model or "fake"
            self._send_json(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
        else:
            self._error(404, f"no route {self.path}")

    # ------------------------------------------------------------------ POST
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        arrival = time.perf_counter()
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"no route {self.path}")
            return
        cfg = self.cfg = self.fake.config
        self.timings = self.fake.timings
        if cfg.api_key and self.headers.get("Authorization") != f"Bearer {cfg.api_key}":
            self._error(401, "Unauthorized")
            return
        n = self.fake.next_request_number()
        if cfg.fail_every and n % cfg.fail_every == 0:
            self._error(503, "injected failure")
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._error(400, "body is not JSON")
            return
        if cfg.model and body.get("model") != cfg.model:
            self._error(404, f"The model `{body.get('model')}` does not exist.")
            return
        drop = bool(cfg.drop_every and n % cfg.drop_every == 0)
        self.scale = _scale(cfg, n, arrival)
        try:
            with self.fake.running():
                self._complete(body, arrival, drop, chat=self.path.endswith("chat/completions"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (closed early, timed out)

    def _complete(self, body: dict[str, Any], arrival: float, drop: bool, chat: bool) -> None:
        cfg = self.cfg
        n_out = int(body.get("max_tokens") or cfg.default_max_tokens)
        n_prompt = _prompt_tokens(body)
        if not body.get("stream"):
            time.sleep((cfg.ttft_s + (n_out - 1) * cfg.itl_s) * self.scale)
            text = " ".join(_WORDS[i % len(_WORDS)] for i in range(n_out))
            self._send_json(200, _full_response(body, chat, text, n_prompt, n_out))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if chat:  # vLLM's first chat chunk carries the role only: not a token
            self._chunk(_sse(_chat_chunk(body, {"role": "assistant", "content": ""}, None)))
        if cfg.keepalive_comments:
            self._chunk(b": ping\n\n")
        if not self._stream_tokens(body, chat, arrival, n_out, drop):
            return
        if (body.get("stream_options") or {}).get("include_usage"):
            self._chunk(_sse(_usage_chunk(body, chat, n_prompt, n_out)))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")  # the terminating zero-length chunk

    def _stream_tokens(
        self, body: dict[str, Any], chat: bool, arrival: float, n_out: int, drop: bool
    ) -> bool:
        """Write the token chunks on schedule; False when the connection was dropped."""
        cfg = self.cfg
        timing: Timing | None = None
        last = arrival
        for i in range(n_out):
            if drop and i == cfg.drop_after:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return False
            delay = arrival + (cfg.ttft_s + i * cfg.itl_s) * self.scale - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            finish = "length" if i == n_out - 1 else None
            word = " " + _WORDS[i % len(_WORDS)]
            chunk = _chat_chunk(body, {"content": word}, finish) if chat else None
            self._chunk(_sse(chunk or _completion_chunk(body, word, finish)))
            now = time.perf_counter()
            if timing is None:
                timing = Timing(now - arrival)
                self.timings.append(timing)
            else:
                timing.gaps_s.append(now - last)
            last = now
        return True


def _scale(cfg: FakeConfig, n: int, arrival: float) -> float:
    """Request ``n``'s delays over the configured ones: its tail, the slowdown, the drift."""
    tail = cfg.slow_factor if cfg.slow_every and n % cfg.slow_every == 0 else 1.0
    return tail * cfg.factor * _drift(cfg, arrival)


def _drift(cfg: FakeConfig, now: float) -> float:
    """The host's slowdown in the period ``now`` falls in (1.0 without drift). Seeded by the
    period's number, so every request of a period shares it without the server keeping any."""
    if cfg.drift_sd <= 0:
        return 1.0
    period = int(now / cfg.drift_period_s)
    return math.exp(random.Random(period).gauss(0.0, cfg.drift_sd))


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 4
    return len(str(body.get("prompt", "")).split())


def _base(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": "cmpl-fake", "object": kind, "created": int(time.time()), "model": body["model"]}


def _chat_chunk(body: dict[str, Any], delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {**_base(body, True), "choices": [choice]}


def _completion_chunk(body: dict[str, Any], text: str, finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {**_base(body, False), "choices": [choice], "usage": None}


def _usage(n_prompt: int, n_out: int) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out, "completion_tokens": n_out}


def _usage_chunk(body: dict[str, Any], chat: bool, n_prompt: int, n_out: int) -> dict[str, Any]:
    return {**_base(body, chat), "choices": [], "usage": _usage(n_prompt, n_out)}


def _full_response(
    body: dict[str, Any], chat: bool, text: str, n_prompt: int, n_out: int
) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice["finish_reason"] = "length"
    return {**_base(body, chat), "choices": [choice], "usage": _usage(n_prompt, n_out)}


class FakeServer:
    """The fake server on a background thread; a context manager. Binds 127.0.0.1 only."""

    def __init__(self, config: FakeConfig | None = None, port: int = 0) -> None:
        self.config = config or FakeConfig()
        self.timings: list[Timing] = []
        self._lock = threading.Lock()
        self._count = 0
        self._running = 0
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests_seen(self) -> int:
        return self._count

    def next_request_number(self) -> int:
        with self._lock:
            self._count += 1
            return self._count

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Counts a stream in flight for /metrics while it runs."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def metrics_text(self) -> str:
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="fake"}} {self._running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="fake"} 0\n'
            "# TYPE vllm:request_success counter\n"
            f'vllm:request_success_total{{model_name="fake"}} {self._count}\n'
        )

    def reset(self, config: FakeConfig | None = None) -> None:
        """New behaviour and fresh counters for the next run."""
        with self._lock:
            self.config = config or self.config
            self._count = 0
            self.timings = []

    def start(self) -> FakeServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (the module run as a command)."""
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ttft", type=float, default=0.2, help="first-token delay, s")
    ap.add_argument("--itl", type=float, default=0.02, help="inter-token delay, s")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--drop-every", type=int, default=0)
    args = ap.parse_args(argv)
    cfg = FakeConfig(
        ttft_s=args.ttft,
        itl_s=args.itl,
        api_key=args.api_key,
        model=args.model,
        fail_every=args.fail_every,
        drop_every=args.drop_every,
    )
    server = FakeServer(cfg, port=args.port)
    print(f"fake OpenAI server on {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
