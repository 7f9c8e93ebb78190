"""The state of one Locust process of a tuner run: its clock, its window, its place in the
request plan and the requests it has in flight. The locustfile builds one at test start; plain
counters suffice because greenlets switch only at I/O.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, Any

from gevent.event import Event

from tuner.measurement.records import PHASE_MEASURE, PHASE_WARMUP, RequestRecord


@dataclass(frozen=True)
class RunSpec:
    """What a process reads once from the run's spec and plan files."""

    plan: list[dict[str, Any]]
    warmup_s: float
    window_s: float
    records_prefix: str

    @cached_property
    def turns(self) -> int:
        """Requests per conversation (workload.sessions): the plan holds whole conversations,
        in turn order; 1 without sessions."""
        return 1 + max((int(e.get("turn") or 0) for e in self.plan), default=0)

    def conversation(self, first: int) -> list[dict[str, Any]]:
        """The plan entries from ``first`` on that one conversation sends (wrapping around)."""
        return [self.plan[(first + k) % len(self.plan)] for k in range(self.turns)]


@dataclass
class RunState:
    """Per-process run state. Greenlets switch only at I/O, so plain counters are safe."""

    t0_perf: float
    t0_wall: float
    run: RunSpec
    pid: int
    worker_index: int
    records: IO[str]
    quota: int | None  # measured requests this process may start; None = no limit
    next_plan: int = 0
    plan_start: int = 0
    started: dict[str, int] = field(default_factory=lambda: {PHASE_WARMUP: 0, PHASE_MEASURE: 0})
    in_flight: dict[str, RequestRecord] = field(default_factory=dict)
    stopped: Event = field(default_factory=Event)
    stopped_at: float | None = None
    seq: int = 0
    quota_stop: bool = False  # the window ended by max_requests, not by time
    prompts_reused: int = 0  # open loop: plan entries sent a second time

    def wall(self, perf: float) -> float:
        """One time base for all instants: wall clock anchored once, advanced monotonically."""
        return self.t0_wall + (perf - self.t0_perf)

    @property
    def stop_perf(self) -> float:
        return self.t0_perf + self.run.warmup_s + self.run.window_s

    @property
    def measure_perf(self) -> float:
        return self.t0_perf + self.run.warmup_s

    def claim(self, at: float | None = None) -> str | None:
        """The phase of a request sent now (scheduled ``at``, open loop), or None once the
        window is over or this process's share of ``max_requests`` is sent."""
        now = time.perf_counter()
        when = now if at is None else at
        if self.stopped.is_set() or when >= self.stop_perf:
            self.stop(now)
            return None
        phase = PHASE_WARMUP if when < self.measure_perf else PHASE_MEASURE
        if phase == PHASE_MEASURE and self.quota is not None and self.started[phase] >= self.quota:
            self.end_by_quota(now)  # a share of 0: nothing to measure here
            return None
        self.started[phase] += 1
        if phase == PHASE_MEASURE and self.quota is not None and self.started[phase] >= self.quota:
            self.end_by_quota(now)  # this one is the last measured request
        return phase

    def end_by_quota(self, now: float) -> None:
        self.stop(now)
        self.quota_stop = True

    def stop(self, now: float) -> None:
        if not self.stopped.is_set():
            self.stopped_at = self.wall(min(now, self.stop_perf))
            self.stopped.set()

    def next_conversation(self) -> list[dict[str, Any]]:
        """The next plan entries to send in turn: one request, or a conversation's turns."""
        first = self.next_plan
        self.next_plan += self.run.turns
        return self.run.conversation(first)

    def open_record(
        self, entry: dict[str, Any], phase: str, sched: float | None, user: str = ""
    ) -> RequestRecord:
        """A record for a request about to be sent, tracked until it is written."""
        self.seq += 1
        rec = RequestRecord(
            request_id=f"{self.pid}-{self.seq}",
            request_class=entry["request_class"],
            api=entry["api"],
            phase=phase,
            scheduled_at=0.0 if sched is None else self.wall(sched),
            sent_at=0.0,
            ok=True,
            max_tokens=entry["max_tokens"],
            user=user,
            turn=int(entry.get("turn") or 0),
        )
        self.in_flight[rec.request_id] = rec
        return rec

    def write(self, rec: RequestRecord) -> None:
        """Write a record once (a straggler may already have been written as cut off)."""
        if self.quota_stop and rec.phase == PHASE_MEASURE and self.stopped_at is not None:
            # The window is [start, end): it ends just after the last claimed request's send,
            # which comes a moment after its claim, or it would hold max_requests - 1.
            self.stopped_at = max(self.stopped_at, rec.sent_at + 1e-6)
        if self.in_flight.pop(rec.request_id, None) is not None:
            self.records.write(rec.to_json() + "\n")
            self.records.flush()

    def write_info(self, **extra: Any) -> None:
        info: dict[str, Any] = {"pid": self.pid, "worker_index": self.worker_index}
        info.update(t0=self.t0_wall, started=self.started, stopped_at=self.stopped_at, **extra)
        closed = max(0, self.next_plan - self.plan_start - len(self.run.plan))
        info["prompts_reused"] = max(closed, self.prompts_reused)
        path = Path(f"{self.run.records_prefix}-{self.pid}.run.json")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(path)
