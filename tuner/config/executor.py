"""The ``ray`` group: the cluster that runs trials when ``study.executor=ray``.

The driver (`tuner run`) decides everything and records it in the storage; Ray only places and
runs trials, by their GPU count, on one node per trial.
"""

from __future__ import annotations

from dataclasses import dataclass

EXECUTORS = ("local", "ray")


@dataclass
class RayConfig:
    """How to reach Ray: ``address`` "" starts a local instance, ``auto`` joins a running one."""

    address: str = ""
    connect_timeout_s: float = 30.0
