"""Reaching Ray: a local instance started here, or a running cluster joined by address.

Every problem before the first trial is bad input (exit 2): Ray not installed, an address that
does not answer, a cluster without the nodes the study needs.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tuner.config.executor import RayConfig
from tuner.errors import ConfigError
from tuner.executor.protocol import Demand

# Ray replaces 127.0.0.1 by the host's routable address unless clusters of several hosts are
# switched off (its own switch, named for the platforms where they are off by default). A local
# instance needs no other host: so it listens on loopback only and nothing outside reaches it.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTO = "auto"


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "study.executor=ray needs Ray, which is not installed",
            hint="pip install 'tuner[ray]' (the set-up's dev extra includes it)",
        ) from None
    return ray


@dataclass
class RayCluster:
    """The connection this process holds: ``started_here`` when it started the instance."""

    ray: ModuleType
    started_here: bool

    def nodes(self) -> list[Demand]:
        """Each alive node's GPUs and CPUs, as Ray declares them."""
        return [node_demand(n) for n in self.ray.nodes() if n.get("Alive")]

    def largest(self) -> Demand:
        nodes = self.nodes()
        return Demand(
            max((n.gpus for n in nodes), default=0), max((n.cpus for n in nodes), default=0)
        )

    def total(self) -> Demand:
        nodes = self.nodes()
        return Demand(sum(n.gpus for n in nodes), sum(n.cpus for n in nodes))

    def close(self) -> None:
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()


def node_demand(node: dict[str, Any]) -> Demand:
    resources = node.get("Resources") or {}
    return Demand(int(resources.get("GPU", 0)), int(resources.get("CPU", 0)))


def connect(config: RayConfig) -> RayCluster:
    """The Ray this process is connected to, or one it connects to now (see RayConfig)."""
    ray = import_ray()
    if ray.is_initialized():  # the caller (a test, a benchmark) connected already
        return RayCluster(ray, False)
    # Trials report through tuner's own lines; Ray's INFO and its notes go to its log files
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if not config.address:
        loopback_only()
        ray.init(
            num_cpus=config.num_cpus or None,
            num_gpus=config.num_gpus or None,
            include_dashboard=False,
            **quiet,
        )
        return RayCluster(ray, True)
    address = _resolve(config.address)
    _check_reachable(address, config.connect_timeout_s)
    ray.init(address=address, **quiet)
    return RayCluster(ray, False)


def loopback_only() -> None:
    """Make a local instance listen on 127.0.0.1 (see LOOPBACK_ENV); Ray reads the switch
    when it is imported, or from its constants afterwards."""
    os.environ[LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


def _resolve(address: str) -> str:
    """``auto``: the cluster started on this host (``ray start``), as host:port."""
    if address != AUTO:
        return address
    from ray._private import services

    try:
        found: str = services.canonicalize_bootstrap_address_or_die(AUTO)
    except ConnectionError as exc:
        raise ConfigError(
            f"ray.address=auto: {str(exc).splitlines()[0]}",
            hint="start one with `ray start --head`, or give ray.address=<host:port>",
        ) from None
    return found


def _check_reachable(address: str, timeout_s: float) -> None:
    """A TCP connection to the head within ``timeout_s`` (ray.init would wait indefinitely)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return
    except ValueError:
        raise ConfigError(
            f"ray.address={address!r} is not host:port", hint="e.g. ray.address=10.0.0.5:6379"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"ray.address={address!r} is unreachable: {exc.strerror or exc}",
            hint="start the head with `ray start --head`, check the address, or leave "
            "ray.address empty for a local instance",
        ) from None
