"""The Locust file that tuner runs in its own subprocess (see tuner.loadgen.locust).

Settings come from the JSON file named by ``TUNER_LOADGEN_SPEC``; the prompts from the plan
file it names. Every request is written as one raw record (tuner.measurement.records) to a
per-process JSONL file, flushed line by line; all statistics are computed from those, never
from Locust's own, which bucket response times and mix failures into percentiles. Locust's
CSV/HTML stay meaningful as human artifacts because each request's response time is set to our
E2E latency.

Timeline of one process: t0 (test start) → warm-up (``warmup_s``) → window (``window_s``, or until
``max_requests`` measured requests have started) → stop issuing → drain (requests already
started finish, up to ``drain_timeout_s``; stragglers are recorded as cut off) → quit.

With ``workload.sessions`` the plan holds whole conversations in turn order: a closed-loop user,
or an open-loop arrival, sends one conversation's turns one after another, each its think time
after the previous answer; a failed turn ends the conversation, which has no answer to carry.

With ``--processes N`` the processes run as one client (tuner.loadgen.process_share): they
share one t0 (the first to start sets it), so warm-up and window are the same instants in each;
an open loop draws one arrival schedule and process ``i`` sends arrivals ``i, i+N, i+2N, ...``
with the plan entries one process would have sent; ``max_requests`` counts the measured
arrivals of all of them (open loop) or is split exactly between them (closed loop). The merged
records are then the single process's schedule, prompts and counts, only sent by several
processes.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import requests
from gevent.pool import Group
from locust import HttpUser, constant, events, task
from locust import stats as locust_stats
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner
from requests.adapters import HTTPAdapter

from tuner.loadgen.process_share import closed_loop_quota, plan_start, shared_t0
from tuner.loadgen.request import consume, fail, prepare
from tuner.loadgen.request_plan import arrival_gaps
from tuner.loadgen.run_state import RunSpec, RunState
from tuner.measurement.records import (
    ERROR_CONNECTION,
    ERROR_STREAM,
    ERROR_TIMEOUT,
    RequestRecord,
)

SPEC: dict[str, Any] = json.loads(Path(os.environ["TUNER_LOADGEN_SPEC"]).read_text())
PLAN: list[dict[str, Any]] = [
    json.loads(line) for line in Path(SPEC["plan"]).read_text().splitlines() if line.strip()
]
RUN = RunSpec(PLAN, SPEC["warmup_s"], SPEC["window_s"], SPEC["records_prefix"])
CLIENT_BUG_EXIT = 3  # Locust's exit code when this file itself failed on a request
REFUSED_BACKOFF_S = 0.1  # a dead server refuses instantly: do not spin out thousands of records
# Locust rewrites its CSV every CSV_STATS_INTERVAL_SEC (1 s) and the quitting hook waits one
# pass so the file counts every request: 1.2 s of every trial's exit, ~2 % of a 55 s trial on a
# fast CPU host (measured in benchmarks/). A quarter second costs four tiny rewrites a second.
locust_stats.CSV_STATS_INTERVAL_SEC = 0.25


class _Deadline(Exception):
    """The request ran past request_timeout_s (raised by a gevent.Timeout)."""


STATE: RunState | None = None
_USER_IDS = itertools.count()
DONE_MESSAGE = "tuner_worker_done"
_DONE_WORKERS: set[str] = set()  # in the master of --processes


def _state() -> RunState:
    assert STATE is not None, "test_start has not run in this process"
    return STATE


# ---------------------------------------------------------------------------- one request
def _exchange(
    session: requests.Session, prepared: requests.PreparedRequest, rec: RequestRecord, chat: bool
) -> float:
    """Send, stream, fill ``rec``; return the send instant (perf_counter)."""
    timeout = SPEC["request_timeout_s"]
    t_send = time.perf_counter()
    rec.sent_at = _state().wall(t_send)
    rec.scheduled_at = rec.scheduled_at or rec.sent_at  # closed loop: sent when scheduled
    try:
        with gevent.Timeout(timeout, _Deadline()):
            resp = session.send(prepared, stream=True, timeout=(timeout, timeout))
            try:
                consume(resp, rec, t_send, chat)
            finally:
                resp.close()
                rec.done_at = _state().wall(time.perf_counter())
    except _Deadline:
        fail(rec, ERROR_TIMEOUT, f"no complete answer within {timeout} s")
    except requests.exceptions.Timeout as exc:
        fail(rec, ERROR_TIMEOUT, repr(exc))
    except requests.exceptions.RequestException as exc:
        # refused/reset/disconnected before any response: may be a client artifact (keep-alive)
        fail(rec, ERROR_CONNECTION, repr(exc))
    return t_send


def _fire_locust_event(user: HttpUser, rec: RequestRecord, t_send: float) -> None:
    """Our E2E (or time to failure) as Locust's response time, so its CSV/HTML mean something."""
    elapsed = rec.e2e_s if rec.ok and rec.e2e_s is not None else time.perf_counter() - t_send
    user.environment.events.request.fire(
        request_type="POST",
        name=f"{rec.api}:{rec.request_class}",
        response_time=elapsed * 1000.0,
        response_length=rec.output_tokens or 0,
        exception=None if rec.ok else RuntimeError(f"{rec.error_kind}: {rec.error[:80]}"),
        context={},
        start_time=rec.sent_at,
    )


def send_one(
    user: HttpUser, entry: dict[str, Any], phase: str, sched: float | None
) -> RequestRecord:
    """Send one planned request, stream the answer, write its record."""
    state = _state()
    prepared = prepare(
        user.client, entry, SPEC["model"], SPEC["base_url"], os.environ.get("TUNER_LOADGEN_API_KEY")
    )
    rec = state.open_record(entry, phase, sched, getattr(user, "user_id", ""))
    try:
        t_send = _exchange(user.client, prepared, rec, entry["api"] == "chat")
    except Exception as exc:  # a bug here, not a server failure: record it, fail the run
        fail(rec, ERROR_STREAM, f"client error: {exc!r}")
        state.write(rec)
        user.environment.process_exit_code = CLIENT_BUG_EXIT
        raise
    _fire_locust_event(user, rec, t_send)
    state.write(rec)
    return rec


# ---------------------------------------------------------------------------- users
class _ServerUser(HttpUser):
    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        # Environment proxies/netrc would be looked up on every request (client overhead that
        # lands in TTFT) and could route around the server under test: talk to it directly.
        self.client.trust_env = False


def converse(
    user: HttpUser, turns: list[dict[str, Any]], phase: str | None, sched: float | None
) -> bool:
    """Send a conversation's turns in order (one request without sessions), each its think time
    after the previous answer; ``phase`` is the first turn's, claimed by the caller. False once
    the window is over. A failed turn ends the conversation: it has no answer to carry on."""
    state = _state()
    for k, entry in enumerate(turns):
        if k:
            gevent.sleep(float(entry.get("think_s") or 0.0))
            phase, sched = state.claim(), None
        if phase is None:
            return False
        rec = send_one(user, entry, phase, sched)
        if rec.error_kind == ERROR_CONNECTION:
            gevent.sleep(REFUSED_BACKOFF_S)
        if not rec.ok:
            break
    return True


class ClosedLoopUser(_ServerUser):
    """One of ``concurrency`` users; each sends its next request (or conversation) when the
    previous ends."""

    def on_start(self) -> None:
        super().on_start()
        self.user_id = f"{os.getpid()}-{next(_USER_IDS)}"  # in every record it sends

    @task
    def one_request(self) -> None:
        state = _state()
        if not converse(self, state.next_conversation(), state.claim(), None):
            raise StopUser()


def _gaps() -> Iterator[float]:
    """The open loop's inter-arrival gaps: a trace's own send times when the plan has them
    (the schedule ends with the trace), else drawn from the rate and burstiness."""
    if PLAN and PLAN[0].get("arrival_s") is not None:
        times = [0.0] + [float(e["arrival_s"]) for e in PLAN]
        return iter([b - a for a, b in itertools.pairwise(times)])
    return arrival_gaps(SPEC["rate"], SPEC["burstiness"], SPEC["seed"] * 1000)


class OpenLoopUser(_ServerUser):
    """The dispatcher of one process: a greenlet per arrival, so a slow server cannot lower the
    offered load. ``scheduled_at`` vs ``sent_at`` shows a lagging client."""

    def on_start(self) -> None:
        super().on_start()
        # Many concurrent streams share this user's session: one pooled connection each.
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=4096, max_retries=0)
        self.client.mount("http://", adapter)
        self.client.mount("https://", adapter)

    @task
    def dispatch(self) -> None:
        """The one arrival schedule of the whole client; this process sends its share of it
        (every ``processes``-th arrival), each with the plan entry of its arrival number."""
        state, share = _state(), SPEC["processes"]
        limit = SPEC["max_requests"] or None
        gaps = _gaps()
        group = Group()
        t_sched, measured = state.t0_perf, 0
        for arrival, gap in enumerate(gaps):
            t_sched += gap
            if t_sched >= state.stop_perf or state.stopped.is_set():
                break
            measured += t_sched >= state.measure_perf
            if limit and measured > limit:  # another process sent the last measured arrival
                state.end_by_quota(time.perf_counter())
                break
            if arrival % share != state.worker_index:
                continue
            gevent.sleep(max(0.0, t_sched - time.perf_counter()))
            phase = state.claim(at=t_sched)
            if phase is None:
                break
            # an arrival opens a conversation (one request without sessions)
            first = arrival * RUN.turns
            state.prompts_reused += first >= len(PLAN)
            group.spawn(converse, self, RUN.conversation(first), phase, t_sched)
            if limit and measured == limit:  # the last measured arrival was this one
                state.end_by_quota(time.perf_counter())
                break
        group.join()  # the window's end is set by the control greenlet, at the exact time
        raise StopUser()


# ---------------------------------------------------------------------------- run control
def _cut_off(state: RunState) -> int:
    """Record requests still running at the drain deadline, so none silently vanish."""
    stragglers = list(state.in_flight.values())
    for rec in stragglers:
        fail(rec, ERROR_TIMEOUT, "cut off: still running at the drain deadline")
        state.write(rec)
    return len(stragglers)


def _control(environment: Environment) -> None:
    """Stop issuing at the end of the window, drain, then end this process's run."""
    state = _state()
    state.stopped.wait(timeout=max(0.0, state.stop_perf - time.perf_counter()))
    state.stop(time.perf_counter())
    drain_end = time.perf_counter() + SPEC["drain_timeout_s"]
    while state.in_flight and time.perf_counter() < drain_end:
        gevent.sleep(0.02)
    cut = _cut_off(state)
    state.write_info(cut_off=cut, finished=True)
    state.records.close()
    environment.stop_timeout = 0  # drained already: do not wait again for killed stragglers
    if isinstance(environment.runner, WorkerRunner):
        # A worker that quit alone would have its users moved to the others by the master:
        # tell the master instead, which ends the run once every worker is done. Final stats
        # first, on the same channel, so the master's CSV/HTML count every request.
        environment.runner._send_stats()
        environment.runner.send_message(DONE_MESSAGE, {"pid": os.getpid()})
    elif environment.runner is not None:
        environment.runner.quit()


def _on_worker_done(environment: Environment, msg: Any, **_kw: Any) -> None:
    _DONE_WORKERS.add(msg.node_id)
    if len(_DONE_WORKERS) >= SPEC["processes"] and environment.runner is not None:
        gevent.spawn(environment.runner.quit)  # not from the message loop it would kill


@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(DONE_MESSAGE, _on_worker_done)


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kw: Any) -> None:
    global STATE
    if isinstance(environment.runner, MasterRunner) or STATE is not None:
        return  # the master of --processes sends no requests
    pid = os.getpid()
    index = max(0, getattr(environment.runner, "worker_index", 0))
    records = open(f"{SPEC['records_prefix']}-{pid}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    t0_wall = shared_t0(SPEC["records_prefix"])
    t0_perf = time.perf_counter() - (time.time() - t0_wall)  # the same instant, on this clock
    quota = closed_loop_quota(index, SPEC["max_requests"], SPEC["processes"], SPEC["mode"])
    STATE = RunState(t0_perf, t0_wall, RUN, pid, index, records, quota)
    STATE.next_plan = STATE.plan_start = plan_start(index, len(PLAN), SPEC["processes"], RUN.turns)
    STATE.write_info(finished=False)
    gevent.spawn(_control, environment)


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_kw: Any) -> None:
    # Locust rewrites its CSV once a second and not at exit: wait for one more pass so the file
    # counts every request (the master's copy, which has the workers' final reports).
    csv = getattr(environment.parsed_options, "csv_prefix", None)
    if csv and not isinstance(environment.runner, WorkerRunner):
        gevent.sleep(locust_stats.CSV_STATS_INTERVAL_SEC + 0.2)
