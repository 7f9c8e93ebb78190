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
    # Cores one trial holds on its node, exactly (0: sized by the trial, see
    # tuner.executor.protocol.demand_of): one per load-generator process, plus a CPU server's ranks,
    # or a GPU server's API process and one per GPU worker, and at least cpus_per_gpu per GPU.
    cpus_per_trial: int = 0
    # A GPU trial's cores per GPU: 0 = the node's CPUs over its GPUs (the least of the
    # cluster's GPU nodes), so that trials filling a node's GPUs share out its cores.
    cpus_per_gpu: int = 0

    def validate(self) -> None:
        if self.connect_timeout_s <= 0:
            raise ConfigError(f"ray.connect_timeout_s must be > 0, got {self.connect_timeout_s}")
        if min(self.num_cpus, self.num_gpus, self.cpus_per_trial, self.cpus_per_gpu) < 0:
            raise ConfigError(
                "ray: num_cpus, num_gpus, cpus_per_trial and cpus_per_gpu must be >= 0"
            )
