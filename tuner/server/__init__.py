"""Inference-server backends behind the :class:`ServerBackend` seam, chosen by ``server.kind``
(the table in :mod:`tuner.server.kinds`)."""

from tuner.search.launch import LaunchSpec
from tuner.server.backend import ServerBackend, ServerInfo
from tuner.server.kinds import (
    KINDS,
    backend_factory,
    make_backend,
    prepare_host,
    register_backend,
    served_by,
)

__all__ = [
    "KINDS",
    "LaunchSpec",
    "ServerBackend",
    "ServerInfo",
    "backend_factory",
    "make_backend",
    "prepare_host",
    "register_backend",
    "served_by",
]
