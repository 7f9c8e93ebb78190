"""What one server launch adds to the fixed server config: vLLM flags and environment variables.

Produced by :mod:`tuner.search.space` from trial params, consumed by :mod:`tuner.server`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LaunchSpec:
    """Flags (name -> value; None = leave out) and environment variables of one launch."""

    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    # CPUs the server's processes may run on; None = not pinned (set per trial by the placement)
    cpus: list[int] | None = None

    def resolved(self, fixed: Mapping[str, Any]) -> dict[str, Any]:
        """Every flag this launch runs: the server's fixed args with the launch's own on top.
        The one place the two meet, so the server, the plan, the executor, the client and the
        export read the same launch."""
        return {**fixed, **self.args}
