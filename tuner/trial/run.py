"""One trial end to end: launch -> ready -> load (+ telemetry) -> stop -> measurements.

A failure of the server or of the load generator is a *trial outcome* (``status="failed"`` with a
reason and the log tail), never an exception that kills a study. Only an interrupt
(KeyboardInterrupt) propagates, after every child process has been reaped.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from tuner.config import TunerConfig
from tuner.errors import LoadGenError, ServerError, TunerError
from tuner.host import placement
from tuner.loadgen import LoadResult, Target, client_capacity, get_load_generator
from tuner.loadgen.client_capacity import REASON_CLIENT_SATURATED
from tuner.loadgen.request_plan import arrival_shape, build_plan
from tuner.measurement.records import RequestRecord, read_records
from tuner.measurement.stats import Measurements, event_rate, measure, span_means
from tuner.paths import TrialPaths
from tuner.quality import run_quality_set
from tuner.schema import TrialStatus
from tuner.search.resolved import ResolvedLaunch
from tuner.server import ServerBackend, ServerInfo, backend_factory
from tuner.server.backend import REASON_DIED_DURING_LOAD
from tuner.telemetry import Telemetry, TelemetrySummary
from tuner.telemetry.metrics import client_lag_warning, over_server
from tuner.telemetry.nvml import visible_entries
from tuner.trial.outcome import (
    REASON_LOADGEN,
    REASON_NO_COMPLETED,
    TrialOutcome,
    TrialPlacement,
    Window,
)

DEVICE_ORDER_ENV = "CUDA_DEVICE_ORDER"
# A window whose client could not keep up is measured again at most this often, with more
# processes each time; a trial still short after that measured its client and fails.
MAX_CLIENT_RERUNS = 2

Progress = Callable[[str], None]


class _Clock:
    """Named phase durations (seconds) for the wall-time breakdown."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start

    def finish(self) -> dict[str, float]:
        self.phases["total"] = time.monotonic() - self.t0
        return {k: round(v, 3) for k, v in self.phases.items()}


def run_trial(
    config: TunerConfig,
    launch: ResolvedLaunch,
    paths: TrialPaths,
    trial_id: str,
    progress: Progress = lambda _msg: None,
) -> TrialOutcome:
    """Run one trial; always returns an outcome (and writes result.json)."""
    paths.ensure()
    clock = _Clock()
    config = with_device_order(config)
    place = placement.for_trial(config, launch.env)
    launch = replace(launch, cpus=list(place.server) if place.server else None)
    rerun = _ClientRerun(config, launch, place)
    # the registry names the backend's class; the launch goes to it from here, as resolved
    server = backend_factory(config.server)(config.server, launch, paths.server_log)
    outcome = TrialOutcome(trial_id, TrialStatus.FAILED, server.argv(), launch.record())
    outcome.folder = str(paths.root)
    outcome.placement = TrialPlacement(place.server, place.client)
    try:
        _run_phases(config, server, rerun, paths, outcome, clock, progress)
    except ServerError as exc:
        outcome.fail(exc.reason, exc.one_line(), exc.log_tail)
    except LoadGenError as exc:
        outcome.fail(REASON_LOADGEN, exc.one_line())
    finally:
        with clock.phase("teardown"):
            server.stop()
        outcome.timings = clock.finish()
        outcome.write(paths.result_json)
    progress(_summary_line(outcome))
    return outcome


def _run_phases(
    config: TunerConfig,
    server: ServerBackend,
    rerun: _ClientRerun,
    paths: TrialPaths,
    outcome: TrialOutcome,
    clock: _Clock,
    progress: Progress,
) -> None:
    progress(f"starting server ({rerun.place.describe()})")
    planner = _plan_ahead(config)
    with clock.phase("startup"):
        server.start()
        info = server.wait_ready(time.monotonic() + config.server.startup_timeout_s)
    outcome.server = info
    outcome.placement.server_read_back = placement.tree_cpus(info.pid)
    progress(_ready_line(info))
    planner.join()  # done long before a server is ready; a wait here shows as unaccounted
    result, summary, records = rerun.load(server, info, paths, clock, progress)
    config = rerun.config  # with the processes of the window that counts
    outcome.placement.client = rerun.place.client
    outcome.placement.client_read_back = rerun.client_cpus
    if rerun.short_by is not None:  # still short after the re-runs: measured the client
        outcome.telemetry = summary
        outcome.fail(REASON_CLIENT_SATURATED, rerun.short_line())
        return
    if config.quality.enabled:  # after the window: never part of the measurement
        progress("quality set: greedy answers for the quality gate")
        with clock.phase("quality"):
            outputs = run_quality_set(_target(config, server, info), config.quality, paths.quality)
        outcome.quality = outputs.summary()
        server.check_alive()
    with clock.phase("analysis"):
        m = measure(
            records,
            result.window_start,
            result.window_end,
            config.slo,
            timeout_s=config.workload.request_timeout_s,
        )
        _compare_clocks(m, records, summary, config.telemetry.client_lag_ratio)
    m.client_processes = config.workload.processes
    m.client_events_s = event_rate(records, result.window_start, result.window_end)
    m.warnings.extend(rerun.notes)
    outcome.measurements = m
    outcome.window = Window(result.window_start, result.window_end)
    outcome.telemetry = summary
    if m.completed == 0:  # e.g. every request rejected (401, 400): nothing was measured
        counts = {**m.errors_by_kind, **({"rejected": m.rejected} if m.rejected else {})}
        errors = ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none sent"
        outcome.fail(REASON_NO_COMPLETED, f"no request completed in the window ({errors})")
        return
    outcome.status = TrialStatus.OK


class _ClientRerun:
    """The load phase, run again with more client processes while its client could not keep
    up (:func:`tuner.loadgen.client_capacity.after_window`): a window that measured the client is
    set aside (its folder renamed) and never scored. The server stays up between windows."""

    def __init__(self, config: TunerConfig, launch: ResolvedLaunch, place: placement.Placement):
        self.config, self.launch, self.place = config, launch, place
        self.client_cpus: list[int] = []
        self.notes: list[str] = []
        self.short_by: int | None = None  # processes a last window still lacked
        self.events_s = 0.0

    def load(
        self,
        server: ServerBackend,
        info: ServerInfo,
        paths: TrialPaths,
        clock: _Clock,
        progress: Progress,
    ) -> tuple[LoadResult, TelemetrySummary, list[RequestRecord]]:
        capacity = client_capacity.load()  # never probed here: the server is up
        for attempt in range(MAX_CLIENT_RERUNS + 1):
            result, summary, self.client_cpus = _load(
                self.config, self.launch, server, info, self.place.client, paths, clock, progress
            )
            records = list(read_records(result.records_path))  # read twice: window, clocks
            processes = self.config.workload.processes
            self.events_s = event_rate(records, result.window_start, result.window_end) or 0.0
            per_core = capacity.events_per_s if capacity else math.inf
            self.short_by = client_capacity.after_window(
                processes, self.events_s, per_core, summary.client_saturated
            )
            if self.short_by is None or attempt == MAX_CLIENT_RERUNS:
                return result, summary, records
            self._widen(paths, attempt + 1, progress)
        raise AssertionError("unreachable")

    def _widen(self, paths: TrialPaths, attempt: int, progress: Progress) -> None:
        assert self.short_by is not None
        before = self.config.workload.processes
        aside = paths.root / f"{paths.loadgen_dir.name}-client-bound-{attempt}"
        with contextlib.suppress(OSError):
            os.replace(paths.loadgen_dir, aside)
            os.replace(paths.requests, aside / paths.requests.name)
        line = (
            f"the client carried {self.events_s:,.0f} events/s on {before} process"
            f"{'es' if before != 1 else ''} and could not keep up: window set aside "
            f"({aside.name}), measured again with {self.short_by} processes"
        )
        progress(line)
        self.notes.append(line)
        workload = replace(self.config.workload, processes=self.short_by)
        self.config = replace(self.config, workload=workload)
        if self.config.placement.client_cpus == placement.AUTO:  # the new count's share
            self.place = placement.Placement(
                self.place.server, placement.for_trial(self.config, self.launch.env).client
            )

    def short_line(self) -> str:
        return (
            f"the client could not keep up after {MAX_CLIENT_RERUNS} re-runs "
            f"({self.events_s:,.0f} events/s on {self.config.workload.processes} processes, "
            f"{self.short_by} needed): the window measured the client, not the server"
        )


def _compare_clocks(
    m: Measurements, records: list[RequestRecord], telemetry: TelemetrySummary, limit: float
) -> None:
    """The client's mean latencies over the server's own (telemetry ``client_over_server``),
    both over the requests in the server's histogram deltas (:func:`span_means`); a lagging
    client is flagged (``client_lagging``) and warned about."""
    server = telemetry.metrics
    start, end = server.get("deltas_from"), server.get("deltas_to")
    means = span_means(records, start, end) if start is not None and end is not None else {}
    ratios = over_server(means, server)
    warning = client_lag_warning(ratios, limit)
    telemetry.client_over_server = {k: round(v, 4) for k, v in ratios.items()}
    telemetry.client_lagging = warning is not None
    if warning:
        m.warnings.append(warning)


def _load(
    config: TunerConfig,
    launch: ResolvedLaunch,
    server: ServerBackend,
    info: ServerInfo,
    client_cpus: tuple[int, ...] | None,
    paths: TrialPaths,
    clock: _Clock,
    progress: Progress,
) -> tuple[LoadResult, TelemetrySummary, list[int]]:
    """Warm-up + window under telemetry, with a watchdog that stops the load if vLLM dies;
    also returns the CPUs the client's processes were allowed, read back as they appeared."""
    target = _target(config, server, info, launch)
    telemetry = Telemetry(
        config.telemetry, info.base_url, server.api_key, info.pid, gpu_devices=_gpus(config)
    )
    watchdog = _Watchdog(server)
    wl = config.workload
    progress(f"load: warm-up {wl.warmup_s:g} s, window {wl.window_s:g} s ({_shape(config)})")
    seen: set[int] = set()
    with clock.phase("load"), telemetry, watchdog:

        def on_spawn(pid: int) -> None:
            telemetry.watch_client(pid)
            watchdog.client_pids.append(pid)
            seen.update(placement.tree_cpus(pid))

        client = get_load_generator("locust")(cpus=client_cpus)
        try:
            result = client.run(target, wl, paths.loadgen_dir, on_spawn)
        except LoadGenError:
            server.check_alive()  # a dead server explains a broken load run better
            raise
    server.check_alive()
    summary = telemetry.summary((result.window_start, result.window_end))
    telemetry.write_csv(paths.telemetry_csv)
    _link_records(result, paths)
    return result, summary, sorted(seen)


def with_device_order(config: TunerConfig) -> TunerConfig:
    """``config`` whose server numbers GPUs as NVML does (PCI bus order), when its
    ``server.cuda_visible_devices`` names GPUs by index: CUDA's own default order (fastest
    first) can differ, and the telemetry would then sample other GPUs than the server uses."""
    server = config.server
    names = visible_entries(server.cuda_visible_devices) or []
    if server.device != "cuda" or not any(n.isdigit() for n in names):
        return config
    if DEVICE_ORDER_ENV in server.env:
        return config
    env = {**server.env, DEVICE_ORDER_ENV: "PCI_BUS_ID"}
    return replace(config, server=replace(server, env=env))


def _gpus(config: TunerConfig) -> list[str] | None:
    """The GPUs the trial samples: its server's (CUDA_VISIBLE_DEVICES' entries), every GPU when
    that is unset, none for a CPU server (a GPU beside it is not part of its cost)."""
    if config.server.device != "cuda":
        return []
    return visible_entries(config.server.cuda_visible_devices)


def _plan_ahead(config: TunerConfig) -> threading.Thread:
    """Synthesize the request plan while vLLM starts: a fresh process pays seconds for the
    tokenizer (4 s of a 55 s trial, measured). The load phase then finds it in
    build_plan's cache; any error is left for the load phase to raise and report."""

    def work() -> None:
        if not config.workload.dataset:  # a dataset is read afresh each trial anyway
            with contextlib.suppress(Exception):
                build_plan(config.workload, config.server.tokenizer)

    thread = threading.Thread(target=work, name="plan-ahead", daemon=True)
    thread.start()
    return thread


def _target(
    config: TunerConfig,
    server: ServerBackend,
    info: ServerInfo,
    launch: ResolvedLaunch | None = None,
) -> Target:
    """The server as the client sees it; ``launch``: the one under load, whose scheduling
    policy says whether the classes' priorities are sent (the quality set sends none)."""
    policy = launch.flags.get(SCHEDULING_POLICY) if launch else None
    return Target(
        base_url=info.base_url,
        api_key=server.api_key,
        model=config.server.served_model_name or config.server.model,
        tokenizer=config.server.tokenizer,
        by_priority=policy == "priority",
    )


SCHEDULING_POLICY = "scheduling_policy"  # vLLM's flag: fcfs (its default) or priority


def _link_records(result: LoadResult, paths: TrialPaths) -> None:
    if result.records_path != paths.requests and result.records_path.exists():
        os.replace(result.records_path, paths.requests)
        result.records_path = paths.requests


class _Watchdog:
    """Polls the server while load runs; if it dies, stops the load generator at once."""

    def __init__(self, server: ServerBackend, interval_s: float = 0.5) -> None:
        self.server = server
        self.interval_s = interval_s
        self.client_pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="server-watchdog", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.server.check_alive()
            except ServerError:
                for pid in self.client_pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGTERM)
                return

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _shape(config: TunerConfig) -> str:
    wl = config.workload
    if wl.trace is not None:  # what the trace sends, not the open loop's unused rate
        t = wl.trace
        head = f"trace {os.path.basename(t.path)} from {t.start_s:g} s, x{t.rate_scale:g}"
        try:
            shape = arrival_shape(build_plan(wl, config.server.tokenizer))
        except TunerError:  # the load phase reports a trace it cannot read, with its reason
            shape = None
        return f"{head}: {shape}" if shape else head
    if wl.mode == "open":
        return f"open loop {wl.rate:g} req/s, burstiness {wl.burstiness:g}"
    return f"closed loop, {wl.concurrency} users"


def _ready_line(info: ServerInfo) -> str:
    kv = f", KV cache {info.kv_cache_tokens:,} tokens" if info.kv_cache_tokens else ""
    return f"server ready in {info.startup_s:.1f} s{kv}"


def _summary_line(outcome: TrialOutcome) -> str:
    if not outcome.ok:
        return f"trial {outcome.trial_id} FAILED ({outcome.reason}): {outcome.message}"
    m = outcome.measurements
    assert m is not None and m.e2e.p99 is not None  # ok implies completed requests
    line = (
        f"trial {outcome.trial_id} ok: {m.completed} requests, "
        f"P99 E2E {m.e2e.p99:.3f} s, {m.output_throughput:.0f} output tok/s"
    )
    if m.rejected:  # not in the latencies above, nor an error: too long for this server
        line += f", {m.rejected} rejected over max_model_len"
    # Shown with the result, not only in result.json: a study's numbers are not the engine's.
    if outcome.telemetry.client_lagging:
        ratios = outcome.telemetry.client_over_server
        line += (
            f"; clock check: E2E {ratios.get('e2e', 0):.2f}x vLLM's own, the latencies "
            "include time outside its engine (result.json warnings)"
        )
    return line


__all__ = ["REASON_DIED_DURING_LOAD", "run_trial"]
