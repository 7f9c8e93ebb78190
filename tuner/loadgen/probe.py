"""Measure one load-generator process's SSE-event capacity on this host, in seconds.

:class:`FastSseServer` is a minimal OpenAI-compatible streaming server (``/v1/completions``,
``/v1/chat/completions``, ``/health``) on 127.0.0.1, run on an asyncio loop in a thread of
this process. One ticker wakes every ``itl_s`` and every open stream writes its next token
event, each in its own write, as vLLM streams them: the client pays a read and a parse per
event, as it does against vLLM, while the server pays one timer per tick for all streams.

:func:`probe` drives it with the real client (:class:`~tuner.loadgen.locust.LocustLoadGenerator`,
one process, a closed loop of many users) at more events per second than one process carries,
and divides the token events read in the window by the CPU seconds the client process spent
in it: the events one process carries at a full core. A host busy with other work gives the
client less of a core but the same events per CPU second, so the measure does not depend on
what else runs beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
from tuner.errors import LoadGenError
from tuner.loadgen.generator import Target
from tuner.loadgen.locust import LocustLoadGenerator
from tuner.loadgen.request_plan import PlannedRequest, plan_size
from tuner.measurement.records import read_records
from tuner.measurement.stats import event_rate


@dataclass(frozen=True)
class ClientCapacity:
    """One measurement of one process's capacity on one host."""

    events_per_s: float  # token events one process carries at a full core
    carried_events_per_s: float = 0.0  # what it carried during the probe, at cpu_cores
    cpu_cores: float = 0.0  # the process's mean CPU (of one core) during the probe
    window_s: float = 0.0
    measured_at: float = 0.0  # wall clock
    host: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClientCapacity:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


PROBE_MODEL = "probe"
_TOKEN = {False: {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}}
_TOKEN[True] = {"choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_TOKEN_CHUNK = {chat: _event(_TOKEN[chat]) for chat in (False, True)}
_DONE = _chunk(b"data: [DONE]\n\n") + _chunk(b"")
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class FastSseServer:
    """The probe's server; a context manager. Tokens every ``itl_s``, ``max_tokens`` each."""

    def __init__(self, itl_s: float = 0.005) -> None:
        self.itl_s = itl_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._tick: asyncio.Future[None] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-sse", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FastSseServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise LoadGenError("the probe's SSE server did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._tick = self._loop.create_future()
        ticker = self._loop.create_task(self._ticker())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            ticker.cancel()
            self._server.close()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _ticker(self) -> None:
        """One timer for every stream: each tick releases the next token of all of them."""
        while True:
            await asyncio.sleep(self.itl_s)
            tick, self._tick = self._tick, self._loop.create_future()
            if tick is not None:
                tick.set_result(None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # small token chunks must not wait for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away
        finally:
            writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *headers = head.decode("latin-1").split("\r\n")
        method, path = [*line.split(" "), "", ""][:2]
        length = 0
        for header in headers:
            name, _, value = header.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        body = await reader.readexactly(length) if length else b""
        if method == "GET":
            status = b"200 OK" if path == "/health" else b"404 Not Found"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return True
        await self._stream(writer, json.loads(body or b"{}"), path.endswith("chat/completions"))
        return True

    async def _stream(
        self, writer: asyncio.StreamWriter, body: dict[str, object], chat: bool
    ) -> None:
        n = int(str(body.get("max_tokens") or 16))
        writer.write(_STREAM_HEAD)
        for _ in range(n):
            assert self._tick is not None
            await self._tick
            writer.write(_TOKEN_CHUNK[chat])
            await writer.drain()
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        writer.write(_event({"choices": [], "usage": usage}) + _DONE)
        await writer.drain()


class _ProbeClient(LocustLoadGenerator):
    """The trials' client with a fixed plan: no tokenizer, the same requests and parsing (a
    plan as long as the probe's requests, so no reuse is reported: the server caches nothing)."""

    def plan(self, target: Target, workload: WorkloadConfig) -> list[PlannedRequest]:
        tokens = int(workload.classes[0].output_tokens.mean)
        size = plan_size(workload)
        return [PlannedRequest("probe", "completions", tokens, 1, prompt="probe")] * size


class _CpuWatch:
    """Each client process's CPU seconds, read every ``interval_s`` until it exits."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples: dict[int, list[tuple[float, float]]] = {}  # pid: (wall, CPU seconds)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def watch(self, pid: int) -> None:
        self.samples[pid] = []
        thread = threading.Thread(target=self._loop, args=(pid,), daemon=True)
        self._threads.append(thread)
        thread.start()

    def _loop(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            while not self._stop.wait(self.interval_s):
                times = proc.cpu_times()
                self.samples[pid].append((time.time(), times.user + times.system))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def cores(self, pid: int, start: float, end: float) -> float | None:
        """Mean cores of ``pid`` over its samples inside ``[start, end]``."""
        inside = [s for s in self.samples.get(pid, []) if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)


@dataclass(frozen=True)
class ProbeRun:
    """One run of the client against :class:`FastSseServer`: what its processes carried."""

    processes: int
    offered_events_s: float  # users / itl: what the server streams when read at once
    carried_events_s: float  # token events the client read per second, all processes
    cores: tuple[float, ...]  # each sending process's mean CPU (of one core)
    window_s: float
    ttft_p99_s: float | None  # against a first token due within one tick
    itl_p99_s: float | None  # against a tick of itl_s

    @property
    def events_per_cpu_s(self) -> float:
        """Token events one process carries per CPU second: its capacity at a full core."""
        busy = sum(self.cores)
        return self.carried_events_s / busy if busy > 0 else 0.0


def probe_workload(users: int, tokens: int, window_s: float) -> WorkloadConfig:
    cls = RequestClass(name="probe", output_tokens=LengthDist(mean=tokens))
    return WorkloadConfig(
        classes=[cls],
        concurrency=users,
        warmup_s=1.0,
        window_s=window_s,
        request_timeout_s=30.0,
        drain_timeout_s=5.0,
        processes=1,
    )


def run_probe(
    processes: int = 1,
    window_s: float = 3.0,
    users: int = 32,
    itl_s: float = 0.004,
    tokens: int = 64,
) -> ProbeRun:
    """Drive :class:`FastSseServer` with the trials' client on ``processes`` processes."""
    workload = replace(probe_workload(users, tokens, window_s), processes=processes)
    watch = _CpuWatch()
    with FastSseServer(itl_s) as server, tempfile.TemporaryDirectory(prefix="tuner-probe-") as tmp:
        target = Target(server.url, None, PROBE_MODEL, "")
        try:
            result = _ProbeClient().run(target, workload, Path(tmp), watch.watch)
        finally:
            watch.stop()
        records = list(read_records(result.records_path))
    start, end = result.window_start, result.window_end
    senders = {int(r.request_id.split("-")[0]) for r in records}
    cores = [watch.cores(pid, start, end) for pid in sorted(senders)]
    carried = event_rate(records, start, end)
    if carried is None or not cores or any(c is None for c in cores):
        raise LoadGenError(
            "the client-capacity probe measured nothing (no events or no CPU reading)",
            hint="run `tuner client-capacity --again` on a less busy host",
        )
    done = [r for r in records if r.ok and r.ttft_s is not None and start <= r.sent_at < end]
    return ProbeRun(
        processes=processes,
        offered_events_s=users / itl_s,
        carried_events_s=carried,
        cores=tuple(c or 0.0 for c in cores),
        window_s=end - start,
        ttft_p99_s=_p99([r.ttft_s or 0.0 for r in done]),
        itl_p99_s=_p99([gap for r in done for gap in r.itl_s]),
    )


def _p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def probe(window_s: float = 3.0, users: int = 16, itl_s: float = 0.004) -> ClientCapacity:
    """One process's capacity on this host (see the module docstring); a few seconds.

    The default offers 4,000 events/s, which one process reads one event per wake-up: a
    client that falls behind reads several events per socket read, each cheaper, and a
    capacity measured so would overstate what it carries while keeping up (in
    benchmarks/client_capacity.py, events per CPU second rose with the offered rate)."""
    run = run_probe(1, window_s, users, itl_s)
    return ClientCapacity(
        events_per_s=round(run.events_per_cpu_s, 1),
        carried_events_per_s=round(run.carried_events_s, 1),
        cpu_cores=round(run.cores[0], 3),
        window_s=round(run.window_s, 3),
        measured_at=time.time(),
        host=socket.gethostname(),
    )
