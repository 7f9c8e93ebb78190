"""How many SSE events per second one load-generator process carries on this host, and how many
processes a trial's load therefore needs.

A Locust process is one Python interpreter: it parses every token event of every stream on
one core. Past its capacity it reads tokens late, and the latencies it records measure the
client, not the server. The capacity is measured once per host by :mod:`tuner.loadgen.probe`
(one process against a fast local SSE server, seconds) and kept in a small JSON file in the
user's cache (:func:`tuner.paths.client_capacity_file`), keyed by host name, CPU model and
tuner version, since each of them changes it.

Sizing (:func:`processes_for`): ``ceil(HEADROOM * expected / capacity)`` processes, never fewer
than the configured ``workload.processes`` (a user's explicit value is a floor). The expected
events per second is the expected output tokens per second (vLLM streams one event per token
by default): the plan's estimate where the trial has one. Without one, the first window
tells: a window whose client could not keep up (a process past its capacity, or one at a full
core) is run again with more processes (:func:`after_window`) and never scored (tuner.trial.run).

The capacity is the token events one process reads per CPU second: at a full core, what it
carries. Measured so, a host busy with other work does not lower it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from tuner.config import TunerConfig
from tuner.errors import ArtifactError
from tuner.host.cpu import read_cpuinfo
from tuner.loadgen.probe import ClientCapacity, probe
from tuner.paths import client_capacity_file

# One process runs at no more than half its measured capacity: the notes saw the tail
# distorted well before a process's core was full.
HEADROOM = 2.0
# A process of a window that carried more than this share of its capacity was past it: the
# window measured the client and is run again with more processes (never scored).
OVER_CAPACITY = 1.0
# A re-run has at most this many times the processes of the window it replaces.
MAX_GROWTH = 4
# A trial whose client still could not keep up after its re-runs: it measured the client.
REASON_CLIENT_SATURATED = "client_saturated"


def tuner_version() -> str:
    """The installed tuner's version: the client's code is part of what a capacity measured."""
    try:
        return metadata.version("tuner")
    except metadata.PackageNotFoundError:
        return "unknown"


def host_key() -> str:
    """What a stored capacity is valid for: this host, its CPU model and this tuner."""
    model = read_cpuinfo().model or "unknown CPU"
    return f"{socket.gethostname()}|{model}|tuner {tuner_version()}"


def load(path: Path | None = None, key: str | None = None) -> ClientCapacity | None:
    """The stored capacity of this host (``key``), or None; an unreadable file is no capacity."""
    path = path or client_capacity_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entry = data[key or host_key()]
        return ClientCapacity.from_dict(entry)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(capacity: ClientCapacity, path: Path | None = None, key: str | None = None) -> Path:
    """Keep ``capacity`` for this host beside other hosts' (a shared home sees several)."""
    path = path or client_capacity_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError):
        data = {}  # a torn file is rewritten, not fatal
    data[key or host_key()] = asdict(capacity)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ArtifactError(
            f"cannot write the client capacity to {path}: {exc}",
            hint="set TUNER_CACHE_DIR to a writable folder",
        ) from exc
    return path


Measure = Callable[[], ClientCapacity]


def measured(measure: Measure | None = None, say: Callable[[str], None] | None = None) -> float:
    """This host's capacity (events/s of one process): stored, or measured now and stored
    (a few seconds, the first time sizing needs it)."""
    found = load()
    if found is not None:
        return found.events_per_s
    if measure is None:
        measure = probe
    if say is not None:
        say("measuring one load-generator process's SSE-event capacity on this host (once)")
    capacity = measure()
    store(replace(capacity, measured_at=capacity.measured_at or time.time()))
    if say is not None:
        say(f"client capacity: {capacity.events_per_s:,.0f} events/s per process")
    return capacity.events_per_s


def processes_for(expected_events_s: float, capacity: float, floor: int = 1) -> int:
    """Processes that carry ``expected_events_s`` at :data:`HEADROOM`, at least ``floor``."""
    if expected_events_s <= 0 or capacity <= 0 or not math.isfinite(expected_events_s):
        return max(floor, 1)
    return max(floor, 1, math.ceil(HEADROOM * expected_events_s / capacity))


def expected_from_plan(config: TunerConfig, attrs: Mapping[str, Any], gpus: int) -> float | None:
    """Expected output tokens/s from a trial's plan estimate (its user attrs, set by the
    pre-screen): the server's rate, capped by what the workload's users can ask for at the
    estimated TPOT. None without an estimate."""
    tok_gpu = _finite(attrs.get("plan_tok_s_gpu"))
    tpot_ms = _finite(attrs.get("plan_tpot_ms"))
    by_users = config.workload.concurrency * 1000.0 / tpot_ms if tpot_ms else None
    if config.workload.mode == "open":
        by_users = None  # an open loop's streams are not bounded by a user count
    by_server = tok_gpu * max(gpus, 1) if tok_gpu else None
    found = [x for x in (by_server, by_users) if x is not None]
    return min(found) if found else None


def _finite(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


@dataclass(frozen=True)
class Sizing:
    """The processes a load gets, and why (a line for the trial's progress)."""

    processes: int
    expected_events_s: float | None
    capacity: float | None

    def line(self, configured: int) -> str:
        if self.processes == configured or self.expected_events_s is None:
            return ""
        return (
            f"load generator: {self.processes} processes instead of {configured} "
            f"(expected {self.expected_events_s:,.0f} events/s, one process carries "
            f"{self.capacity or 0:,.0f} on this host, {HEADROOM:g}x headroom)"
        )


def sized(
    config: TunerConfig,
    expected_events_s: float | None,
    say: Callable[[str], None] | None = None,
    capacity: float | None = None,
) -> TunerConfig:
    """``config`` with ``workload.processes`` raised to carry ``expected_events_s``; the same
    config when nothing is expected or the configured processes suffice."""
    if expected_events_s is None or expected_events_s <= 0:
        return config
    floor = config.workload.processes
    capacity = capacity or measured(say=say)
    want = processes_for(expected_events_s, capacity, floor)
    if want == floor:
        return config
    sizing = Sizing(want, expected_events_s, capacity)
    if say is not None:
        say(sizing.line(floor))
    return replace(config, workload=replace(config.workload, processes=want))


def after_window(
    processes: int, events_s: float, capacity: float, cpu_saturated: bool
) -> int | None:
    """The processes to run a window again with, when the last one's client could not keep up
    (a process past its capacity, or one at a full core): None when it kept up."""
    over = events_s / max(processes, 1) > OVER_CAPACITY * capacity
    if not (over or cpu_saturated):
        return None
    want = max(processes + 1, processes_for(events_s, capacity, processes))
    return min(want, MAX_GROWTH * processes)  # in steps: a wrong capacity spawns no hundreds


def for_job(
    config: TunerConfig,
    devices: int,
    attrs: Mapping[str, Any],
    say: Callable[[str], None] | None = None,
) -> TunerConfig:
    """The config a trial's job runs with: its processes sized to the plan's estimate of this
    trial (``attrs``, its user attrs), on the ``devices`` its launch takes (the count is all
    the sizing reads of it). Sized before the job is dispatched, since an executor gives the
    job cores by its processes."""
    gpus = devices if config.server.device == "cuda" else 1
    return sized(config, expected_from_plan(config, attrs, gpus), say)


def command(again: bool = False, say: Callable[[str], None] = print) -> int:
    """``tuner client-capacity``: the stored capacity of this host, or a new measurement."""
    found = None if again else load()
    if found is None:
        say("measuring one load-generator process against a local SSE server (seconds)")
        found = probe()
        store(found)
    print(
        f"one load-generator process carries {found.events_per_s:,.0f} SSE events/s at a full "
        f"core on this host ({host_key()}); measured carrying {found.carried_events_per_s:,.0f} "
        f"events/s at {found.cpu_cores:.2f} cores; stored in {client_capacity_file()}"
    )
    return 0
