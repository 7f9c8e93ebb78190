"""A candidate's GPUs against the host's, before anything is estimated or launched.

One server occupies TP x PP x DP GPUs of one node (a trial never spans nodes). A point that needs
more than the host has would wait forever for a Ray node that does not exist, or fail in vLLM's
start-up; the plan marks it as not fitting and the study screens it unlaunched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.config import TunerConfig
from tuner.search import space as search_space
from tuner.search.resolved import resolve_params
from tuner.telemetry import gpu_count
from tuner.telemetry.nvml import visible_entries


def host_gpus(config: TunerConfig) -> int:
    """The GPUs one server may use here, as the study's executor would count them: a local Ray
    instance's declared GPUs, else ``server.cuda_visible_devices`` when declared, else the
    GPUs NVML sees. 0 when none is known (a CPU host planning for a GPU one)."""
    if config.server.device != "cuda":
        return 0
    if config.study.executor == "ray" and not config.ray.address and config.ray.num_gpus:
        return config.ray.num_gpus
    visible = visible_entries(config.server.cuda_visible_devices)
    return len(visible) if visible is not None else gpu_count()


def gpus_of(config: TunerConfig, params: Mapping[str, Any]) -> int:
    """The GPUs a server with ``params`` (on top of the fixed args) occupies: TP x PP x DP."""
    specs = search_space.flatten(config.search_space)
    known = {p: v for p, v in params.items() if p in specs}
    return resolve_params(known, specs, config.server).devices


def too_many_gpus(needed: int, host: int) -> str | None:
    """The line that says a server cannot fit the host's GPUs, or None (``host`` 0: unknown)."""
    if host <= 0 or needed <= host:
        return None
    return f"needs {needed} GPUs, the host has {host}"


def over_host(config: TunerConfig, params: Mapping[str, Any], host: int) -> str | None:
    """:func:`too_many_gpus` for the server ``params`` run on top of the fixed args."""
    return too_many_gpus(gpus_of(config, params), host)
