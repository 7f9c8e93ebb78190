"""How much load can one Locust process drive? Tuner's client against the fake streaming server
with known delays (tuner/testing/sse_server.py), growing concurrency at a short inter-token gap:
the SSE events/s one Locust process sustains before its TTFT P99 moves by 5 ms. The fake runs
in this process and records the delays it really achieved, so the client's own share of a TTFT
shift (client P99 - server P99) is reported next to the raw shift.

    .venv/bin/python -m benchmarks.fidelity headroom  # the CLI lives in benchmarks.fidelity
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.layout import ROOT
from tuner import (
    LengthDist,
    LocustLoadGenerator,
    RequestClass,
    SloConfig,
    Target,
    WorkloadConfig,
    measure,
    read_records,
)


class CpuWatch:
    """CPU seconds of one process tree, sampled until it exits (the last sample counts)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self._threads: list[threading.Thread] = []

    def watch(self, pid: int) -> None:
        t = threading.Thread(target=self._loop, args=(pid,), daemon=True)
        t.start()
        self._threads.append(t)

    def _loop(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            while proc.is_running():
                times = proc.cpu_times()
                self.cpu_s = max(self.cpu_s, times.user + times.system)
                time.sleep(0.2)
        except psutil.Error:
            return

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=5)


def headroom(args: argparse.Namespace) -> dict[str, Any]:
    from tuner.testing.sse_server import FakeConfig, FakeServer
    from tuner.testing.tiny_tokenizer import make_tiny_tokenizer

    tok = ROOT / "models" / "tiny-llama"
    levels: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="headroom-") as tmp:
        tok_dir = tok if (tok / "tokenizer.json").exists() else make_tiny_tokenizer(Path(tmp))
        with FakeServer(
            FakeConfig(ttft_s=args.ttft, itl_s=args.itl, keepalive_comments=False)
        ) as fake:
            target = Target(fake.url, None, "fake", str(tok_dir))
            for users in args.users:
                fake.reset()
                levels.append(_level(fake, target, users, args, Path(tmp) / f"u{users}"))
                print(json.dumps(levels[-1]), flush=True)
    base = levels[0]
    for lv in levels:
        lv["ttft_p99_shift_ms"] = round(lv["client_ttft_p99_ms"] - base["client_ttft_p99_ms"], 2)
        lv["client_share_shift_ms"] = round(
            lv["client_minus_server_p99_ms"] - base["client_minus_server_p99_ms"], 2
        )
    ok = [lv for lv in levels if lv["ttft_p99_shift_ms"] <= args.shift_ms]
    return {
        "fake": {"ttft_s": args.ttft, "itl_s": args.itl, "output_tokens": args.output_len},
        "window_s": args.window,
        "levels": levels,
        "shift_limit_ms": args.shift_ms,
        "sustained_events_per_s": max((lv["events_per_s"] for lv in ok), default=None),
    }


def _level(fake: Any, target: Target, users: int, args: argparse.Namespace, out: Path) -> dict:
    cls = RequestClass(
        prompt_tokens=LengthDist(mean=32), output_tokens=LengthDist(mean=args.output_len)
    )
    wl = WorkloadConfig(
        classes=[cls],
        mode="closed",
        concurrency=users,
        warmup_s=2.0,
        window_s=args.window,
        drain_timeout_s=30.0,
    )
    cpu = CpuWatch()
    t0 = time.monotonic()
    result = LocustLoadGenerator().run(target, wl, out, cpu.watch)
    wall = time.monotonic() - t0
    cpu.join()
    records = list(read_records(result.records_path))
    m = measure(records, result.window_start, result.window_end, SloConfig())
    done = [r for r in records if r.ok and r.phase == "measure"]
    events = sum(len(r.itl_s) + 1 for r in done)
    server_ttft = [t.first_token_s for t in fake.timings]
    client_p99, server_p99 = (
        (m.ttft.p99 or 0.0) * 1000,
        float(np.percentile(server_ttft, 99)) * 1000,
    )
    return {
        "users": users,
        "events_per_s": round(events / m.window_s),
        "completed": m.completed,
        "errors": m.failed,
        "client_ttft_p99_ms": round(client_p99, 2),
        "server_ttft_p99_ms": round(server_p99, 2),
        "client_minus_server_p99_ms": round(client_p99 - server_p99, 2),
        "itl_p50_ms": round((m.itl.p50 or 0) * 1000, 2),
        "client_cpu_cores": round(cpu.cpu_s / wall, 2),  # averaged over the whole run
    }
