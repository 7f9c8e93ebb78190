"""The ``cost`` group: prices for the cost objective."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostConfig:
    """Prices for the cost objective: per GPU-hour by GPU model, or per CPU-hour on CPU."""

    gpu_hour: dict[str, float] = field(default_factory=dict)  # e.g. {"H100": 2.5}
    gpu_model: str = ""  # key into gpu_hour; empty = detect with NVML
    cpu_hour: float = 0.05  # price of one vCPU-hour
    cpus: int = 0  # 0 = os.cpu_count()
