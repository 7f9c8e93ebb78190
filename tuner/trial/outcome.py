"""What one trial produced, as typed data: written as result.json, read back by a resumed study.

A failed server or load run is an outcome too (``status`` failed, with a reason and the server
log's tail), so a study records it and the sampler learns to avoid it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tuner.errors import ArtifactError
from tuner.measurement.stats import Measurements
from tuner.quality import QualityResult
from tuner.schema import TrialStatus
from tuner.search.launch import LaunchSpec
from tuner.server import ServerInfo
from tuner.telemetry import TelemetrySummary

REASON_LOADGEN = "load_generator_failed"
REASON_NO_COMPLETED = "no_completed_requests"
# Told without a launch: vLLM's own config validation refused the flags, or the GPU estimator
# says the configuration cannot fit (study.prescreen). Neither counts as a launch.
REASON_INVALID_CONFIG = "invalid_config"
REASON_SCREENED = "screened"
NOT_LAUNCHED = (REASON_INVALID_CONFIG, REASON_SCREENED)

CpuList = tuple[int, ...]


@dataclass
class TrialPlacement:
    """The CPUs asked for each side (None: not pinned) and those read back from the kernel."""

    server: CpuList | None = None
    client: CpuList | None = None
    server_read_back: list[int] = field(default_factory=list)
    client_read_back: list[int] = field(default_factory=list)

    def asked(self, side: str) -> CpuList | None:
        return self.server if side == "server" else self.client


@dataclass(frozen=True)
class Window:
    """The measurement window, in wall-clock seconds (the request records' time base)."""

    start: float
    end: float


@dataclass
class TrialOutcome:
    """Everything a trial produced; serialised as result.json and as Optuna user attrs."""

    trial_id: str
    status: TrialStatus
    argv: list[str]
    launch: LaunchSpec
    reason: str = ""
    message: str = ""
    log_tail: str = ""
    server: ServerInfo | None = None
    measurements: Measurements | None = None
    telemetry: TelemetrySummary = field(default_factory=TelemetrySummary)
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    window: Window | None = None
    quality: QualityResult | None = None
    placement: TrialPlacement = field(default_factory=TrialPlacement)
    folder: str = ""

    @property
    def ok(self) -> bool:
        return self.status == TrialStatus.OK

    def metrics(self) -> Measurements | None:
        return self.measurements

    def fail(self, reason: str, message: str, log_tail: str = "") -> None:
        self.status, self.reason = TrialStatus.FAILED, reason
        self.message, self.log_tail = message, log_tail

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialOutcome:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = TrialStatus(values.get("status", TrialStatus.FAILED))
        values["launch"] = LaunchSpec(**(values.get("launch") or {}))
        values["server"] = ServerInfo(**values["server"]) if values.get("server") else None
        m = values.get("measurements")
        values["measurements"] = Measurements.from_dict(m) if m else None
        values["telemetry"] = TelemetrySummary.from_dict(values.get("telemetry") or {})
        values["window"] = Window(**values["window"]) if values.get("window") else None
        q = values.get("quality")
        values["quality"] = QualityResult.from_dict(q) if q else None
        values["placement"] = _placement(values.get("placement") or {})
        return cls(**values)

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)  # atomic: a reader never sees half a result
        except OSError as exc:  # e.g. a full disk: the run cannot keep its results
            raise ArtifactError(
                f"cannot write the trial result {path}: {exc.strerror or exc}",
                hint="free disk space or fix the permissions of studies_dir, then run again",
            ) from exc

    @classmethod
    def read(cls, path: Path) -> TrialOutcome:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def _placement(data: dict[str, Any]) -> TrialPlacement:
    def cpus(value: Any) -> CpuList | None:
        return None if value is None else tuple(int(c) for c in value)

    return TrialPlacement(
        server=cpus(data.get("server")),
        client=cpus(data.get("client")),
        server_read_back=list(data.get("server_read_back") or []),
        client_read_back=list(data.get("client_read_back") or []),
    )
