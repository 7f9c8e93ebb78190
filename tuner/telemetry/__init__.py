"""Telemetry of a trial: GPUs (NVML), processes (psutil) and the server's /metrics.

:class:`Telemetry` starts the three samplers around a load test and turns them into one
:class:`TelemetrySummary` and one long-format ``telemetry.csv``::

    with Telemetry(cfg.telemetry, server.base_url, api_key, server_pid, gpu_indices) as tel:
        tel.watch_client(locust_pid)
        ...                                    # run the load
    summary = tel.stop(window=(t0, t1))        # stop() is idempotent; window narrows the summary
    tel.write_csv(trial_dir / "telemetry.csv")

All times are wall-clock seconds (``time.time()``), the time base of the request records. No
sampler raises once started: problems end up in ``TelemetrySummary.warnings``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd

from tuner.config import TelemetryConfig
from tuner.errors import ArtifactError
from tuner.telemetry._base import PeriodicSampler, Window
from tuner.telemetry.metrics import MetricsPoller, ScrapeError, parse_metrics, scrape
from tuner.telemetry.nvml import NvmlSampler, gpu_count, gpu_inventory
from tuner.telemetry.process_usage import CLIENT, SERVER, ProcessSampler

__all__ = [
    "CSV_COLUMNS",
    "MetricsPoller",
    "NvmlSampler",
    "ProcessSampler",
    "ScrapeError",
    "Telemetry",
    "TelemetrySummary",
    "Window",
    "gpu_count",
    "gpu_inventory",
    "parse_metrics",
    "scrape",
]

CSV_COLUMNS = ["source", "t", "entity", "metric", "value"]


@dataclass
class TelemetrySummary:
    """What the samplers saw, as plain floats (keys without data are absent, never NaN)."""

    gpu: dict[str, float] = field(default_factory=dict)
    process: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    client_saturated: bool = False
    warnings: list[str] = field(default_factory=list)
    # The client's mean latencies over the server's own for the same requests, and whether
    # they show a client that read tokens late (set by the trial after its window).
    client_over_server: dict[str, float] = field(default_factory=dict)
    client_lagging: bool = False
    gpu_devices: list[str] = field(default_factory=list)  # the UUIDs of the GPUs sampled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TelemetrySummary:
        return cls(
            gpu=dict(data.get("gpu", {})),
            process=dict(data.get("process", {})),
            metrics=dict(data.get("metrics", {})),
            client_saturated=bool(data.get("client_saturated", False)),
            warnings=list(data.get("warnings", [])),
            client_over_server=dict(data.get("client_over_server", {})),
            client_lagging=bool(data.get("client_lagging", False)),
            gpu_devices=list(data.get("gpu_devices", [])),
        )


class Telemetry:
    """All samplers of one trial behind start / watch_client / stop; also a context manager.

    ``base_url`` None skips /metrics, ``server_pid`` None skips the server's process tree,
    ``gpu_indices`` None samples every GPU NVML sees and ``[]`` none; ``gpu_devices`` (a
    server's CUDA_VISIBLE_DEVICES entries, indices or UUIDs) wins over it.
    """

    def __init__(
        self,
        config: TelemetryConfig,
        base_url: str | None = None,
        api_key: str | None = None,
        server_pid: int | None = None,
        gpu_indices: list[int] | None = None,
        gpu_devices: list[str] | None = None,
    ) -> None:
        self.config = config
        self.server_pid = server_pid
        self._warnings: list[str] = []
        self.process = ProcessSampler(config.interval_s)
        self.gpu = self._make_gpu_sampler(gpu_indices, gpu_devices)
        self.metrics = (
            MetricsPoller(base_url, api_key, config.metrics_interval_s) if base_url else None
        )

    def _make_gpu_sampler(
        self, indices: list[int] | None, devices: list[str] | None
    ) -> NvmlSampler | None:
        if not self.config.nvml or indices == [] or devices == []:
            return None
        if gpu_count() == 0:
            asked = devices or indices
            if asked:  # GPUs were asked for by name, so their absence is news
                self._warnings.append(f"NVML unavailable: no telemetry for GPUs {asked}")
            return None
        return NvmlSampler(self.config.interval_s, indices, devices)

    @property
    def samplers(self) -> list[PeriodicSampler]:
        found = [self.gpu, self.process, self.metrics]
        return [s for s in found if s is not None]

    def start(self) -> None:
        """Start every sampler. Only a wrong GPU index raises (ConfigError)."""
        if self.server_pid is not None:
            self.process.watch(SERVER, self.server_pid)
        try:
            for sampler in self.samplers:
                sampler.start()
        except BaseException:
            self._stop_all()  # why: no thread may outlive a failed start
            raise

    def watch_client(self, pid: int) -> None:
        """Also sample the load generator's process tree (call once its pid is known)."""
        self.process.watch(CLIENT, pid)

    def stop(self, window: Window | None = None) -> TelemetrySummary:
        """Stop and join every sampler (idempotent) and summarise, optionally over ``window``."""
        self._stop_all()
        return self.summary(window)

    def _stop_all(self) -> None:
        for sampler in self.samplers:
            sampler.stop()

    def summary(self, window: Window | None = None) -> TelemetrySummary:
        saturated = self.process.client_saturated(self.config.client_saturation_cpu)
        warnings = list(self._warnings)
        for sampler in self.samplers:
            warnings.extend(sampler.warnings)
        if saturated:
            warnings.append(
                f"load generator saturated: one client process averaged "
                f"{self.process.busiest_process_cores(CLIENT):.2f} cores; "
                "raise workload.processes or the numbers measure the client"
            )
        return TelemetrySummary(
            gpu=self.gpu.summary(window) if self.gpu else {},
            gpu_devices=list(self.gpu.sampled) if self.gpu else [],
            process=self.process.summary(window),
            metrics=self.metrics.summary(window) if self.metrics else {},
            client_saturated=saturated,
            warnings=warnings,
        )

    def summary_dict(self, window: Window | None = None) -> dict[str, Any]:
        """:meth:`summary` as a JSON-ready dict (for result.json and Optuna user attrs)."""
        return self.summary(window).to_dict()

    def frame(self) -> pd.DataFrame:
        """Every sample in long format: columns source, t, entity, metric, value."""
        parts = [_long("process", self.process.samples, "label")]
        if self.gpu is not None:
            parts.append(_long("nvml", self.gpu.samples, "gpu"))
        if self.metrics is not None:
            metrics = self.metrics.samples.rename(columns={"name": "metric"})
            parts.append(metrics.assign(source="metrics", entity="server"))
        parts = [p[CSV_COLUMNS] for p in parts if not p.empty]
        if not parts:
            return pd.DataFrame(columns=CSV_COLUMNS)
        return pd.concat(parts, ignore_index=True).sort_values("t", kind="stable")

    def write_csv(self, path: Path) -> Path:
        """Write :meth:`frame` to ``path`` (e.g. ``trials/<id>/telemetry.csv``)."""
        try:
            self.frame().to_csv(path, index=False)
        except OSError as exc:
            raise ArtifactError(f"cannot write telemetry to {path}: {exc}") from exc
        return path

    def __enter__(self) -> Telemetry:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_all()


def _long(source: str, frame: pd.DataFrame, entity: str) -> pd.DataFrame:
    """Wide samples (t, the entity column, metric columns) -> source, t, entity, metric, value."""
    if frame.empty:
        return pd.DataFrame(columns=CSV_COLUMNS)
    long = frame.melt(id_vars=["t", entity], var_name="metric", value_name="value")
    long = long.rename(columns={entity: "entity"}).dropna(subset=["value"])
    return long.assign(source=source)
