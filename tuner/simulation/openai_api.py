"""The simulated GPU host's HTTP side: vLLM's OpenAI API, /health, /metrics, over one engine.

Requests stream like vLLM 0.3x's (a role-only first chat chunk, one chunk per token, a usage
chunk when ``stream_options.include_usage`` is set, then ``[DONE]``), so the real load generator
reads them as it reads vLLM. The engine loop runs a step, waits its modelled duration (times
the rehearsal's ``time_scale``) on an absolute clock, then hands each sequence its token.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from aiohttp import web

from tuner.simulation import fake_nvml
from tuner.simulation.engine import Engine, Sequence, Step
from tuner.simulation.exposition import SimMetrics
from tuner.simulation.physics import Physics

STATE_EVERY_S = 0.5  # how often the fake NVML readings are refreshed


@dataclass
class Flight:
    """A request in the engine, with the queue its tokens reach its handler by."""

    seq: Sequence
    tokens: asyncio.Queue[float] = field(default_factory=asyncio.Queue)
    first_at: float | None = None
    last_at: float | None = None
    sent_at: float | None = None  # the engine's last token of it (the inter-token gaps)


@dataclass
class SimServer:
    """One simulated vLLM server: its physics, its engine and what it has served."""

    physics: Physics
    model: str
    devices: list[int]
    count_tokens: Callable[[str], int]
    time_scale: float = 1.0
    api_key: str | None = None
    engine: Engine = field(init=False)
    metrics: SimMetrics = field(init=False)
    flights: dict[int, Flight] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    busy_s: float = 0.0
    ids: count[int] = field(default_factory=count)

    def __post_init__(self) -> None:
        self.engine = Engine(self.physics)
        self.metrics = SimMetrics(self.model)

    # ---------------------------------------------------------------- the engine loop
    async def run_engine(self) -> None:
        clock = time.monotonic()
        while True:
            if self.engine.idle:
                self.wake.clear()
                await self.wake.wait()
                clock = time.monotonic()
            step = self.engine.step(clock)
            clock += step.duration_s * self.time_scale
            self.busy_s += step.duration_s * self.time_scale
            await asyncio.sleep(max(clock - time.monotonic(), 0.0))
            self._deliver(step, time.monotonic())
            self.metrics.state(self.engine)

    def _deliver(self, step: Step, now: float) -> None:
        for seq in step.tokens:
            flight = self.flights.get(seq.rid)
            if flight is None:
                continue
            if flight.sent_at is not None:
                self.metrics.observe("vllm:inter_token_latency_seconds", now - flight.sent_at)
            flight.sent_at = now
            flight.tokens.put_nowait(now)

    async def write_state(self) -> None:
        """The fake NVML readings of this server's devices: busy while steps run."""
        pid, last_busy, last_t = os.getpid(), 0.0, time.monotonic()
        # vLLM takes its share of each GPU at start-up (weights, then KV cache up to
        # gpu_memory_utilization): memory in use does not follow the load.
        mem = fake_nvml.memory_mib(self.physics.system) * self.physics.launch.gpu_memory_utilization
        while True:
            now = time.monotonic()
            util = min(100.0, 100.0 * (self.busy_s - last_busy) / max(now - last_t, 1e-6))
            last_busy, last_t = self.busy_s, now
            for index in self.devices:
                fake_nvml.write_state(index, util, mem, pid)
            await asyncio.sleep(STATE_EVERY_S)

    def clear_state(self) -> None:
        for index in self.devices:
            fake_nvml.clear_state(index, os.getpid())

    # ---------------------------------------------------------------- requests
    def submit(self, prompt_tokens: int, max_tokens: int) -> Flight:
        seq = Sequence(next(self.ids), prompt_tokens, max(max_tokens, 1), time.monotonic())
        flight = Flight(seq)
        self.flights[seq.rid] = flight
        self.engine.add(seq)
        self.wake.set()
        return flight

    def finish(self, flight: Flight) -> None:
        """Account for a request that ended; one whose client left is aborted, as vLLM does."""
        self.flights.pop(flight.seq.rid, None)
        seq, end = flight.seq, flight.last_at or time.monotonic()
        if not seq.done:
            self.engine.abort(seq)
            return
        ttft = (flight.first_at or end) - seq.arrived_at
        queue = (seq.admitted_at or seq.arrived_at) - seq.arrived_at
        self.metrics.finished(seq, ttft, end - seq.arrived_at, queue)


def _base(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": "cmpl-sim", "object": kind, "created": int(time.time()), "model": body["model"]}


def _token_chunk(body: dict[str, Any], chat: bool, finish: str | None) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": " tok"}, "logprobs": None}
    else:
        choice = {"index": 0, "text": " tok", "logprobs": None}
    choice["finish_reason"] = finish
    return {**_base(body, chat), "choices": [choice]}


def _usage(n_prompt: int, n_out: int) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def prompt_text(body: dict[str, Any], chat: bool) -> str:
    if not chat:
        prompt = body.get("prompt", "")
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])


def make_app(sim: SimServer) -> web.Application:
    """The aiohttp application of ``sim``: routes, auth, and the engine's background tasks."""

    def authorized(request: web.Request) -> bool:
        return not sim.api_key or request.headers.get("Authorization") == f"Bearer {sim.api_key}"

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=sim.metrics.text(), content_type="text/plain")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": sim.model, "object": "model"}]})

    async def completions(request: web.Request, chat: bool) -> web.StreamResponse:
        if not authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        n_prompt = sim.count_tokens(prompt_text(body, chat))
        flight = sim.submit(n_prompt, int(body.get("max_tokens") or 16))
        if not body.get("stream"):
            return await _whole(sim, flight, body, chat)
        return await _stream(sim, flight, body, chat, request)

    async def completion(request: web.Request) -> web.StreamResponse:
        return await completions(request, chat=False)

    async def chat_completion(request: web.Request) -> web.StreamResponse:
        return await completions(request, chat=True)

    async def start_engine(app: web.Application) -> None:
        app["tasks"] = [
            asyncio.create_task(sim.run_engine()),
            asyncio.create_task(sim.write_state()),
        ]

    async def stop_engine(app: web.Application) -> None:
        for task in app["tasks"]:
            task.cancel()
        sim.clear_state()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", chat_completion)
    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    return app


async def _tokens(flight: Flight) -> None:
    """Wait for every token of ``flight``, recording when the first and last came."""
    for _ in range(flight.seq.max_tokens):
        at = await flight.tokens.get()
        flight.first_at = flight.first_at or at
        flight.last_at = at


async def _whole(
    sim: SimServer, flight: Flight, body: dict[str, Any], chat: bool
) -> web.StreamResponse:
    try:
        await _tokens(flight)
    finally:
        sim.finish(flight)
    text = " tok" * flight.seq.generated
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice["finish_reason"] = "length"
    usage = _usage(flight.seq.prompt_tokens, flight.seq.generated)
    return web.json_response({**_base(body, chat), "choices": [choice], "usage": usage})


async def _stream(
    sim: SimServer, flight: Flight, body: dict[str, Any], chat: bool, request: web.Request
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if chat:  # vLLM's first chat chunk carries the role only: not a token
        role = {**_base(body, chat), "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        await resp.write(_sse(role))
    seq, sent = flight.seq, 0
    try:
        while sent < seq.max_tokens:
            at = await flight.tokens.get()
            flight.first_at = flight.first_at or at
            flight.last_at = at
            sent += 1
            finish = "length" if sent >= seq.max_tokens else None
            await resp.write(_sse(_token_chunk(body, chat, finish)))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {**_base(body, chat), "choices": [], "usage": _usage(seq.prompt_tokens, sent)}
            await resp.write(_sse(usage))
        await resp.write(b"data: [DONE]\n\n")
    finally:
        sim.finish(flight)
    return resp
