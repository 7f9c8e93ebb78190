"""A small OpenAI-compatible streaming server with known delays, for benchmarks of the client side.

Token ``i`` of a request is written at ``arrival + (ttft + i * itl) * scale`` on an absolute
schedule, where ``scale`` is ``slow_factor`` for every ``slow_every``-th request (a tail of known
size) times ``factor`` for all of them (a slowdown of known size). A regression of known size is
then a setting, not a guess: ``factor=1.5`` streams every request 1.5 times as long, so a
closed loop serves 1/1.5 of the tokens; ``slow_every=10, slow_factor=2`` doubles the slowest
tenth, so the P99 doubles while the throughput hardly moves. Settings are read per request, so a
benchmark changes them between runs without a restart. Binds 127.0.0.1 only.

A real host is not that steady: ``drift_sd`` multiplies every delay by a factor drawn afresh
each ``drift_period_s`` (lognormal, seeded), so windows differ as a busy host's do, by about
``drift_sd / sqrt(window_s / drift_period_s)``.
"""

from __future__ import annotations

import json
import math
import random
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Delays:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    factor: float = 1.0
    slow_every: int = 0
    slow_factor: float = 1.0
    drift_sd: float = 0.0
    drift_period_s: float = 1.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    model: str
    delays: Delays
    count: int
    lock: threading.Lock
    factors: dict[int, float]

    def drift(self, now: float) -> float:
        """The host's slowdown in the period ``now`` falls in (1.0 without drift)."""
        d = self.delays
        if d.drift_sd <= 0:
            return 1.0
        period = int(now / d.drift_period_s)
        with self.lock:
            if period not in self.factors:
                self.factors[period] = math.exp(random.Random(period).gauss(0.0, d.drift_sd))
            return self.factors[period]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Small token chunks must leave at once, as vLLM's uvicorn sends them.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model}]})
        else:
            self._json(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        arrival = time.perf_counter()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with self.server.lock:
            self.server.count += 1
            n = self.server.count
        d = self.server.delays
        scale = d.factor * (d.slow_factor if d.slow_every and n % d.slow_every == 0 else 1.0)
        scale *= self.server.drift(arrival)
        n_out = int(body.get("max_tokens") or 16)
        prompt = len(str(body.get("prompt", "")).split())
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": n_out,
            "total_tokens": prompt + n_out,
        }
        base = {"id": "cmpl-fake", "object": "text_completion", "model": body.get("model")}
        if not body.get("stream"):
            time.sleep((d.ttft_s + (n_out - 1) * d.itl_s) * scale)
            choice = {"index": 0, "text": " x" * n_out, "finish_reason": "length"}
            self._json(200, {**base, "choices": [choice], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(n_out):
            wait = arrival + (d.ttft_s + i * d.itl_s) * scale - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            finish = "length" if i == n_out - 1 else None
            choice = {"index": 0, "text": " x", "finish_reason": finish}
            self._chunk(b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            last = {**base, "choices": [], "usage": usage}
            self._chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


class FakeOpenAI:
    """The server on a background thread; a context manager."""

    def __init__(self, model: str, delays: Delays | None = None) -> None:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.model, self._httpd.delays = model, delays or Delays()
        self._httpd.count, self._httpd.lock, self._httpd.factors = 0, threading.Lock(), {}
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def set(self, delays: Delays) -> None:
        self._httpd.delays = delays

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
