"""The ``ray`` group: the cluster that runs trials when ``study.executor=ray``.

The driver (`tuner run`) decides everything and records it in the storage; Ray only places and
runs trials, by their GPU count, on one node per trial.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError

EXECUTORS = ("local", "ray")


@dataclass
class RayConfig:
    """How to reach Ray: ``address`` "" starts a local instance, ``auto`` joins a running one,
    ``host:port`` joins that cluster's head."""

    address: str = ""
    connect_timeout_s: float = 30.0
    # A local instance declares these (0: what Ray detects on this host). Declaring GPUs the
    # host lacks tests the scheduling without the hardware; never do it for a real study.
    num_cpus: int = 0
    num_gpus: int = 0
    # Cores one trial holds on its node: 0 = one per load-generator process plus one for a GPU
    # server (its API and engine processes) or one per rank of a CPU server.
    cpus_per_trial: int = 0

    def validate(self) -> None:
        if self.connect_timeout_s <= 0:
            raise ConfigError(f"ray.connect_timeout_s must be > 0, got {self.connect_timeout_s}")
        if min(self.num_cpus, self.num_gpus, self.cpus_per_trial) < 0:
            raise ConfigError("ray: num_cpus, num_gpus and cpus_per_trial must be >= 0")
