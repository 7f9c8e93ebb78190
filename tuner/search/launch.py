"""What one server launch adds to the fixed server config: vLLM flags and environment variables.

Produced by :mod:`tuner.search.space` from trial params; resolved against the server's fixed
settings by :func:`tuner.search.resolved.resolve`, and stored as is in a trial's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LaunchSpec:
    """Flags (name -> value; None = leave out) and environment variables of one launch."""

    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    # CPUs the server's processes were pinned to; None = not pinned. A result stores them
    # here (ResolvedLaunch.record); a caller that pins a server itself may set them too.
    cpus: list[int] | None = None
