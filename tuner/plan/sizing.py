"""From a rate one server sustains to a deployment: replicas, GPUs and cost per month.

``replicas = ceil(target x (1 + headroom) / max rate)``, ``GPUs = replicas x GPUs per server``,
and the cost from the ``cost`` config's list prices. ``tuner plan --target-rps`` sizes with an
estimated rate, ``tuner capacity`` with a measured one; the measured result is kept in the study
folder (:data:`CAPACITY_FILE`) where ``tuner export --format k8s`` reads its replica count.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.config import CostConfig
from tuner.errors import ArtifactError, ConfigError

HOURS_PER_MONTH = 730.0  # 365 x 24 / 12
CAPACITY_DIR = "capacity"
CAPACITY_FILE = "capacity.json"
CPU = "CPU"  # a CPU server's billing unit (a GPU server's is its GPU model)


def check_target(target_rps: float, headroom: float) -> None:
    """ConfigError (one line, exit 2) for a target rate or headroom that sizes nothing."""
    if not target_rps > 0 or not math.isfinite(target_rps):
        raise ConfigError(f"the target rate must be > 0 requests/s, got {target_rps:g}")
    if not 0 <= headroom < 1:
        raise ConfigError(f"headroom must be in [0, 1), got {headroom:g}")


def price_key(prices: dict[str, float], model: str) -> str | None:
    """The price list's key for a GPU model name: exact, else a whole word of it (so "A10"
    never prices an "A100")."""
    if model in prices:
        return model
    words = {w.upper() for w in re.split(r"[\s\-_]+", model) if w}
    matches = [key for key in prices if key.upper() in words]
    return max(matches, key=len) if matches else None


@dataclass(frozen=True)
class Price:
    """USD per hour of one server, and what it is made of."""

    per_hour: float  # NaN: no price known
    basis: str  # e.g. "2 x H200 at $3.79/GPU-hour"
    count: int = 0  # the GPUs (or CPUs) one server is billed for; 0: no price
    unit: str = ""  # what one of them is: "H200", "CPU"
    rate: float = math.nan  # USD per hour of one of them

    def basis_for(self, servers: int) -> str:
        """What ``servers`` servers are billed for: every GPU the line prices, not one
        server's ("4 x H200" for 2 replicas of TP 2)."""
        if self.count <= 0 or not math.isfinite(self.rate):
            return self.basis
        n = self.count * servers
        if self.unit == CPU:
            return f"{n} CPU{'s' * (n != 1)} at ${self.rate:g}/CPU-hour"
        return f"{n} x {self.unit} at ${self.rate:g}/GPU-hour"


def server_price(cost: CostConfig, device: str, gpu: str, devices: int, cpus: int) -> Price:
    """One server's hourly price: its GPUs (TP x PP) on cuda, its CPUs on cpu."""
    if device == "cuda":
        key = price_key(cost.gpu_hour, gpu) or price_key(cost.gpu_hour, cost.gpu_model)
        if key is None:
            return Price(math.nan, f"no price for {gpu or 'this GPU'} in cost.gpu_hour")
        rate = cost.gpu_hour[key]
        basis = f"{devices} x {key} at ${rate:g}/GPU-hour"
        return Price(rate * devices, basis, devices, key, rate)
    count = cost.cpus or cpus or os.cpu_count() or 1
    plural = "s" if count != 1 else ""
    basis = f"{count} CPU{plural} at ${cost.cpu_hour:g}/CPU-hour"
    return Price(cost.cpu_hour * count, basis, count, CPU, cost.cpu_hour)


@dataclass(frozen=True)
class Sizing:
    """A deployment for a target rate."""

    target_rps: float
    headroom: float
    rate_per_replica: float
    replicas: int
    gpus: int  # 0 on CPU servers
    cost_per_month: float  # NaN without a price
    price_basis: str

    def lines(self, what: str) -> list[str]:
        cost = (
            f"${self.cost_per_month:,.0f}/month ({self.price_basis})"
            if math.isfinite(self.cost_per_month)
            else f"cost unknown ({self.price_basis})"
        )
        gpus = f", {self.gpus} GPUs" if self.gpus else ""
        return [
            f"for {self.target_rps:g} req/s with {self.headroom:.0%} headroom: "
            f"{self.replicas} replicas{gpus} at {self.rate_per_replica:.3g} req/s each ({what})",
            f"  {cost}",
        ]


def size(
    target_rps: float, headroom: float, rate_per_replica: float, devices: int, price: Price
) -> Sizing:
    """Replicas for ``target_rps`` with ``headroom`` spare, at ``rate_per_replica`` each."""
    check_target(target_rps, headroom)
    if not rate_per_replica > 0:
        raise ConfigError(f"a replica's rate must be > 0 to size for it, got {rate_per_replica}")
    # devices: GPUs per replica, 0 for a CPU server (which the price counts in CPUs)
    # A tiny epsilon keeps 10 / (10 / 3) from rounding up to a fourth replica.
    replicas = max(1, math.ceil(target_rps * (1 + headroom) / rate_per_replica - 1e-9))
    gpus = replicas * devices
    monthly = price.per_hour * replicas * HOURS_PER_MONTH
    basis = price.basis_for(replicas)  # the whole deployment, as the cost it explains
    return Sizing(target_rps, headroom, rate_per_replica, replicas, gpus, monthly, basis)


@dataclass
class CapacityStep:
    """One measured rate of a capacity search."""

    offered_rps: float  # the rate asked of the load generator
    sent_rps: float  # the rate it really started requests at, in the window
    goodput_rps: float  # completed requests that met every SLO, per second
    throughput_rps: float  # completed requests per second
    error_rate: float
    p99_s: dict[str, float | None]  # ttft, tpot, e2e
    meets: bool
    why: str = ""  # the SLO or limit it missed
    phase: str = "sweep"  # sweep | bisect


@dataclass
class CapacityRecord:
    """The measured capacity of one configuration of a study, as ``capacity.json`` keeps it."""

    study: str
    choice: str  # which configuration: "final incumbent (batching trial 3)", "trial ..."
    params: dict[str, Any]
    max_rps: float  # the highest rate measured to meet the SLOs
    upper_rps: float  # the lowest rate measured to miss them (inf: none missed)
    slo: dict[str, float]
    steps: list[CapacityStep] = field(default_factory=list)
    sizing: Sizing | None = None
    devices: int = 1  # GPUs per replica (0: a CPU server)
    confirmed: bool = False  # a second window at max_rps met the SLOs too

    @property
    def uncertainty_rps(self) -> float:
        """The capacity lies in [max_rps, upper_rps): the search's resolution."""
        return self.upper_rps - self.max_rps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["upper_rps"] = None if math.isinf(self.upper_rps) else self.upper_rps
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityRecord:
        values = dict(data)
        values.pop("simulated", None)  # a rehearsal's stamp (tuner capacity), not a field
        values["steps"] = [CapacityStep(**s) for s in values.get("steps") or []]
        upper = values.get("upper_rps")
        values["upper_rps"] = math.inf if upper is None else float(upper)
        sizing = values.get("sizing")
        values["sizing"] = Sizing(**sizing) if sizing else None
        return cls(**values)


def capacity_path(study_root: Path) -> Path:
    return study_root / CAPACITY_DIR / CAPACITY_FILE


def write_capacity(study_root: Path, record: CapacityRecord) -> Path:
    path = capacity_path(study_root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record.to_dict(), indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def read_capacity(study_root: Path) -> CapacityRecord | None:
    """The study's stored capacity result, or None (none measured, or unreadable)."""
    try:
        return CapacityRecord.from_dict(json.loads(capacity_path(study_root).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
