"""The ServerBackend seam: start an inference server with given flags, wait, stop.

A backend is a context manager; leaving the ``with`` block always reaps the server's whole
process group, whatever happened inside. The kinds are listed by ``server.kind`` in
:mod:`tuner.server.kinds`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

from tuner.config import ServerConfig
from tuner.search.resolved import ResolvedLaunch

# Failure reasons a trial can report (also stored in Optuna user attrs).
REASON_OOM = "out_of_memory"
REASON_INVALID_ARGUMENT = "invalid_argument"
REASON_ENGINE_INIT = "engine_init_failed"
REASON_PORT_IN_USE = "port_in_use"
REASON_STARTUP_TIMEOUT = "startup_timeout"
REASON_DIED_DURING_LOAD = "died_during_load"
REASON_ILLEGAL_INSTRUCTION = "illegal_instruction"  # a CPU instruction the host refused
REASON_OTHER = "exited_during_startup"


@dataclass
class ServerInfo:
    """Facts learned from a started server (its log and its answers)."""

    base_url: str
    pid: int
    startup_s: float
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    version: str | None = None
    # A simulated host's start-up on the GPUs it stands for (it sleeps a shrunk one): what a
    # rehearsal adds back to tell the wall time of the same study on real GPUs.
    gpu_startup_s: float | None = None


class ServerBackend(Protocol):
    """A server that a trial can start, probe and stop."""

    log_path: Path

    def argv(self) -> list[str]:
        """The exact command line (without secrets) that :meth:`start` runs."""
        ...

    def preflight(self) -> None:
        """Reject a launch that cannot work before any process starts (PreflightError)."""
        ...

    def start(self) -> None: ...

    def wait_ready(self, deadline: float) -> ServerInfo:
        """Block until ready or raise ServerStartError; ``deadline`` is a monotonic time."""
        ...

    def check_alive(self) -> None:
        """Raise ServerDiedError if the server process has exited."""
        ...

    def stop(self) -> None: ...

    @property
    def base_url(self) -> str: ...

    @property
    def api_key(self) -> str | None: ...

    @property
    def pid(self) -> int | None: ...

    def __enter__(self) -> ServerBackend: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class BackendFactory(Protocol):
    def __call__(
        self, config: ServerConfig, launch: ResolvedLaunch, log_path: Path
    ) -> ServerBackend: ...


# What the tuner's own process must know before it looks at the host (its GPUs' inventory, a
# fingerprint): a simulated host's GPUs are seen through a simulated NVML.
HostSetup = Callable[[ServerConfig], None]
