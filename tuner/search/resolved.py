"""A candidate's launch resolved once against the server's fixed settings.

A proposal (:class:`~tuner.search.launch.LaunchSpec`, what the study varies and stores) meets
the server's own args in :func:`resolve` and nowhere else, so the server's command line, the
plan, the executor's demand, the client's sizing and the export all read the same flags and
the same device count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.config import ServerConfig
from tuner.search import space
from tuner.search.checks import devices_needed
from tuner.search.launch import LaunchSpec


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def args_to_argv(args: Mapping[str, Any]) -> list[str]:
    """vLLM flags from a name->value mapping: True -> --x, False -> --no-x, None -> omitted."""
    argv: list[str] = []
    for name, value in args.items():
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, list | tuple):
            argv.append(flag(name))
            argv.extend(str(v) for v in value)
        else:
            argv.extend([flag(name), str(value)])
    return argv


@dataclass(frozen=True)
class ResolvedLaunch:
    """A proposal resolved once against the server's fixed settings: the flags the server
    runs and the devices they take, passed down from where a launch is decided to the server
    that runs it, so nothing below merges or counts again."""

    spec: LaunchSpec  # the candidate's own flags and env: what the study varies and stores
    # every flag the server runs: server.args with the candidate's on top (None = leave out)
    flags: dict[str, Any]
    # the candidate's env vars; the backend adds the server's own and the process's at start
    env: dict[str, str]
    devices: int  # GPUs (or CPU ranks) one server takes: devices_needed(flags)
    cpus: list[int] | None = None  # cores the server is pinned to, set per trial by placement
    # the flags as vLLM's command line, rendered here once: a backend puts its own head (the
    # model, host and port) before them and renders nothing of the candidate's again
    argv: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        # derived, never passed: a copy made with other flags (dataclasses.replace) re-renders
        object.__setattr__(self, "argv", tuple(args_to_argv(self.flags)))

    def record(self) -> LaunchSpec:
        """The launch as a trial's result stores it: the candidate's flags, the env it ran
        with (an executor may rebind a thread binding onto its cores) and the cores it was
        pinned to, the same fields result.json always held."""
        return replace(self.spec, env=dict(self.env), cpus=self.cpus)


def resolve(spec: LaunchSpec, server: ServerConfig) -> ResolvedLaunch:
    """The one place the server's fixed args and a candidate's meet: the candidate's on top."""
    flags = {**server.args, **spec.args}
    return ResolvedLaunch(spec, flags, dict(spec.env), devices_needed(flags), spec.cpus)


def resolve_params(
    params: Mapping[str, Any], specs: Mapping[str, space.SpecLike], server: ServerConfig
) -> ResolvedLaunch:
    """Stored ``params`` (a study's configuration, as ``specs`` launch them) resolved on
    ``server``: what a baseline, a confirmation, the plan, the export and capacity run."""
    return resolve(space.to_launch(params, specs), server)
