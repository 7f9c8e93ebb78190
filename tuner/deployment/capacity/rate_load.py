"""One server, started once, loaded at one open-loop rate after another.

Each rate is a Locust run of the study's request mix with Poisson (or the workload's gamma)
arrivals: an overloaded server cannot lower an open loop's offered load, so its queue, and its
P99s, grow, which is what a capacity search has to see. Every run has its own folder under the
capacity folder; the server log is kept beside them.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import TracebackType

from tuner.config import SloConfig, TunerConfig
from tuner.config.workload import WorkloadConfig
from tuner.deployment.capacity.sweep import verdict
from tuner.host import placement
from tuner.loadgen import LocustLoadGenerator, Target
from tuner.measurement.records import read_records
from tuner.measurement.stats import measure
from tuner.plan.sizing import CapacityStep
from tuner.search.resolved import ResolvedLaunch
from tuner.server import ServerBackend, ServerInfo, make_backend

MIN_DRAIN_S = 10.0


def rate_workload(base: WorkloadConfig, rate: float, window_s: float | None) -> WorkloadConfig:
    """The study's request mix as an open loop at ``rate``; the drain is cut to a few times
    the SLOs' scale, since a request still queued then has missed them anyway."""
    return dataclasses.replace(
        base,
        mode="open",
        rate=rate,
        window_s=window_s or base.window_s,
        max_requests=0,
        drain_timeout_s=min(base.drain_timeout_s, max(MIN_DRAIN_S, base.request_timeout_s / 4)),
    )


class ServedConfig:
    """The chosen configuration's server, up for the whole search (a context manager)."""

    def __init__(self, config: TunerConfig, launch: ResolvedLaunch, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.place = placement.for_trial(config, launch.env)
        cpus = list(self.place.server) if self.place.server else None
        self.launch = dataclasses.replace(launch, cpus=cpus)
        self.server: ServerBackend = make_backend(config.server, self.launch, folder / "server.log")
        self.info: ServerInfo | None = None
        self.count = 0

    def __enter__(self) -> ServedConfig:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.server.preflight()
        self.server.start()
        try:
            deadline = time.monotonic() + self.config.server.startup_timeout_s
            self.info = self.server.wait_ready(deadline)
        except BaseException:
            self.server.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.stop()

    @property
    def server_cpus(self) -> int:
        return len(self.place.server or ())

    def target(self) -> Target:
        assert self.info is not None, "the server is not up"
        server = self.config.server
        return Target(
            base_url=self.info.base_url,
            api_key=self.server.api_key,
            model=server.served_model_name or server.model,
            tokenizer=server.tokenizer,
        )

    def measure(self, rate: float, phase: str, window_s: float | None = None) -> CapacityStep:
        """Load the server at ``rate`` req/s and judge the window against the SLOs."""
        self.count += 1
        out = self.folder / "steps" / f"{self.count:02d}-{rate:.4g}rps"
        workload = rate_workload(self.config.workload, rate, window_s)
        step = measure_rate(self.target(), workload, self.config.slo, out, phase, self.place.client)
        self.server.check_alive()  # a server that died under load is an error, not a verdict
        return step


def measure_rate(
    target: Target,
    workload: WorkloadConfig,
    slo: SloConfig,
    out: Path,
    phase: str,
    client_cpus: tuple[int, ...] | None = None,
) -> CapacityStep:
    """One open-loop Locust run at ``workload.rate`` against ``target``, judged by ``slo``."""
    result = LocustLoadGenerator(cpus=client_cpus).run(target, workload, out)
    m = measure(
        read_records(result.records_path),
        result.window_start,
        result.window_end,
        slo,
        timeout_s=workload.request_timeout_s,
    )
    return verdict(m, slo, workload.rate, phase)
