"""The ``plan`` group: estimates before launching, and capacity for a target load.

Estimates come from NVIDIA's AIConfigurator (the ``plan`` extra) for a GPU system; they screen
and order candidates but never replace a measurement in a decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError


@dataclass
class PlanConfig:
    """Where and how to estimate, and the load to size for."""

    system: str = ""  # AIConfigurator's system name (h200_sxm, ...); "" = the GPUs NVML sees
    backend_version: str = ""  # its vLLM data version; "" = the one it maintains as current
    # The model whose architecture is estimated; "" = server.model. A local folder with a
    # config.json or a model id AIConfigurator ships (e.g. meta-llama/Meta-Llama-3.1-70B).
    model: str = ""
    max_points: int = 300  # a sample of a larger (or continuous) search space
    values_per_range: int = 5  # points taken along each int/float range of the space
    target_rps: float = 0.0  # the traffic to size for (0 = none)
    headroom: float = 0.3  # capacity kept spare for bursts: replicas for target x (1 + headroom)

    def validate(self) -> None:
        if self.max_points < 1 or self.values_per_range < 2:
            raise ConfigError(
                "plan: need max_points >= 1 and values_per_range >= 2, got "
                f"{self.max_points} and {self.values_per_range}"
            )
        if self.target_rps < 0:
            raise ConfigError(f"plan.target_rps must be > 0 (0: none), got {self.target_rps}")
        if not 0 <= self.headroom < 1:
            raise ConfigError(f"plan.headroom must be in [0, 1), got {self.headroom}")
