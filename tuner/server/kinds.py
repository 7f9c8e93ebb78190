"""The server backends by ``server.kind``, listed in one visible place.

Each backend module defines its server class and nothing else happens when it is imported: this
table names every built-in kind with its factory, what its host needs before the tuner looks at
it, and the words a progress line uses for what a launch of it measures. A plugin adds its own
kind with :func:`register_backend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.config import ServerConfig
from tuner.errors import ConfigError
from tuner.search.resolved import ResolvedLaunch
from tuner.server.backend import BackendFactory, HostSetup, ServerBackend
from tuner.server.external import ExternalServer
from tuner.server.simulated import SimulatedGpuServer, simulated_host
from tuner.server.vllm import VllmServer


@dataclass(frozen=True)
class Kind:
    """One ``server.kind``."""

    factory: BackendFactory
    host: HostSetup | None = None  # run before anything reads the host's devices
    # what a launch measures, in a progress line's words: a rehearsal's lines must say it
    # measures a simulation, never "vLLM"
    serves: str = "vLLM"


KINDS: dict[str, Kind] = {
    "vllm": Kind(VllmServer),
    "simulated_gpu": Kind(SimulatedGpuServer, simulated_host, "the SIMULATED GPU host"),
    "external": Kind(ExternalServer, serves="the external endpoint"),
}


def register_backend(
    kind: str, factory: BackendFactory, host: HostSetup | None = None, serves: str = "vLLM"
) -> None:
    """A plugin's server kind (an ``objectives/`` module may add one)."""
    KINDS[kind] = Kind(factory, host, serves)


def served_by(kind: str) -> str:
    """What a launch of ``kind`` measures, for the lines a user reads."""
    found = KINDS.get(kind)
    return found.serves if found else kind


def prepare_host(config: ServerConfig) -> None:
    """Run the host set-up of ``config.kind``, if it has one (before any telemetry)."""
    found = KINDS.get(config.kind)
    if found is not None and found.host is not None:
        found.host(config)


def backend_factory(config: ServerConfig) -> BackendFactory:
    """The factory of ``config.kind``: the registry names the class, and the caller hands it
    the launch (nothing here reads one)."""
    found = KINDS.get(config.kind)
    if found is None:
        known = ", ".join(sorted(KINDS))
        raise ConfigError(f"server.kind={config.kind!r} is unknown (known: {known})")
    return found.factory


def make_backend(config: ServerConfig, launch: ResolvedLaunch, log_path: Path) -> ServerBackend:
    """Build the backend named by ``config.kind``."""
    return backend_factory(config)(config, launch, log_path)
