"""Inference-server backends behind the :class:`ServerBackend` seam."""

from tuner.server import external as _external  # noqa: F401  (registers "external")
from tuner.server import simulated as _simulated  # noqa: F401  (registers "simulated_gpu")
from tuner.server import vllm as _vllm  # noqa: F401  (registers the "vllm" backend)
from tuner.server.backend import (
    SERVER_BACKENDS,
    LaunchSpec,
    ServerBackend,
    ServerInfo,
    make_backend,
    prepare_host,
)

__all__ = [
    "SERVER_BACKENDS",
    "LaunchSpec",
    "ServerBackend",
    "ServerInfo",
    "make_backend",
    "prepare_host",
]
