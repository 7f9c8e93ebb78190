"""Which CPUs a trial's server and its load generator run on (Linux CPU affinity).

On a CPU server the load generator competes with the engine for the same cores. Measured on a
2-core host, vLLM's processes held 1.9 of the 2 cores and the client
read mean E2E latencies 2-3.5x vLLM's own histograms: the latencies of such a trial are mostly
time outside the engine, and a study compares configurations by them. With the server on one
core and the client on the other, both clients agreed with the server's clock within 2.5 %.

On a GPU server the engine computes on the GPUs, but its API server (tokenizing, streaming)
and its workers (scheduling, launching kernels) are CPU-bound processes, and a load generator
beside them on the same cores delays what both measure.

``placement.server_cpus`` / ``placement.client_cpus`` take ``auto``, ``all`` (not pinned) or a
CPU list (``0-6,8``). ``auto`` gives the client the last ``workload.processes`` allowed CPUs and
the server the rest (:func:`split`), on hosts with at least two CPUs. A CPU list that vLLM-CPU
is told to bind its threads to (``VLLM_CPU_OMP_THREADS_BIND``, e.g. a tensor-parallel trial's
``0|1``) wins over ``auto``: the server runs where vLLM binds, the client on what is left (or
everywhere, when nothing is). On Ray, a trial's cores on its node are split the same way
(:mod:`tuner.executor.remote`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from tuner.config import PlacementConfig, TunerConfig
from tuner.errors import ConfigError

AUTO, ALL = "auto", "all"
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM-CPU: "auto", "nobind" or "0-3|4-7" per rank


@dataclass(frozen=True)
class Placement:
    """The CPUs of each side; None = not pinned (the OS schedules it on any allowed CPU)."""

    server: tuple[int, ...] | None
    client: tuple[int, ...] | None

    def describe(self) -> str:
        """One line for a trial's progress, e.g. ``server on CPUs 0, client on 1``."""
        if self.server is None and self.client is None:
            return "server and client on every CPU"
        return f"server on CPUs {_side(self.server)}, client on {_side(self.client)}"

    def as_text(self) -> dict[str, str]:
        """``{"server": "0", "client": "1"}``, ``all`` for a side that is not pinned."""
        return {"server": cpus_text(self.server), "client": cpus_text(self.client)}


def _side(cpus: Sequence[int] | None) -> str:
    return "every CPU" if cpus is None else format_cpus(cpus)


def cpus_text(cpus: Sequence[int] | None) -> str:
    """A side's CPUs as a list (``0-2,5``), or ``all`` when it is not pinned."""
    return format_cpus(cpus) if cpus else ALL


def parse_cpus(text: str, where: str) -> tuple[int, ...]:
    """``"0-3,6"`` -> (0, 1, 2, 3, 6); ConfigError naming ``where`` on anything else."""
    cpus: set[int] = set()
    try:
        for part in text.replace(" ", "").split(","):
            low, dash, high = part.partition("-")
            first, last = int(low), int(high if dash else low)
            if first < 0 or last < first:
                raise ValueError(part)
            cpus.update(range(first, last + 1))
    except ValueError:
        raise ConfigError(
            f"{where}={text!r} is not a CPU list",
            hint="write e.g. 0-6 or 0,2,4, or auto, or all (not pinned)",
        ) from None
    return tuple(sorted(cpus))


def format_cpus(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> ``"0-2,5"``: the form taskset, lscpu and vLLM use."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's or taskset's limit, not the host's)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def plan(
    config: PlacementConfig,
    device: str,
    server_env: Mapping[str, str],
    client_processes: int,
    allowed: Sequence[int] | None = None,
) -> Placement:
    """The placement of one trial, from the config, the server's environment and the host."""
    allowed = tuple(allowed) if allowed is not None else allowed_cpus()
    server = _explicit(config.server_cpus, "placement.server_cpus", allowed)
    client = _explicit(config.client_cpus, "placement.client_cpus", allowed)
    if len(allowed) < 2:  # auto pins nothing there; explicit lists stand
        return Placement(server, client)
    auto_server, auto_client = config.server_cpus == AUTO, config.client_cpus == AUTO
    if auto_server and device == "cpu":
        server = _vllm_binding(server_env, allowed)
    if auto_client:
        client = _rest(allowed, server) if server else split(allowed, client_processes).client
    if auto_server and server is None and client is not None:
        server = _rest(allowed, client)
    return Placement(server, client)


def split(cpus: Sequence[int], client_processes: int) -> Placement:
    """``cpus`` shared out: the client the last ones, one per load-generator process, the
    server the rest, never all to the client; a single CPU is not split (neither side is
    pinned apart)."""
    cpus = tuple(cpus)
    if len(cpus) < 2:
        return Placement(None, None)
    share = min(max(client_processes, 1), len(cpus) - 1)
    return Placement(cpus[:-share], cpus[-share:])


def for_trial(config: TunerConfig, launch_env: Mapping[str, str] | None = None) -> Placement:
    """The placement of a trial of ``config`` whose launch adds ``launch_env`` (its own thread
    binding counts), on this host."""
    env = {**config.server.env, **(launch_env or {})}
    return plan(config.placement, config.server.device, env, config.workload.processes)


def _explicit(value: str, where: str, allowed: Sequence[int]) -> tuple[int, ...] | None:
    if value in (AUTO, ALL):
        return None
    cpus = parse_cpus(value, where)
    outside = sorted(set(cpus) - set(allowed))
    if outside:
        raise ConfigError(
            f"{where}={value!r} names CPUs {format_cpus(outside)} that this process may not use "
            f"(allowed: {format_cpus(allowed)})",
            hint="pick CPUs from the allowed list, or set it to auto",
        )
    return cpus


def _vllm_binding(env: Mapping[str, str], allowed: Sequence[int]) -> tuple[int, ...] | None:
    """The CPUs vLLM-CPU is told to bind its ranks' threads to, if the environment says."""
    value = env.get(OMP_BIND_ENV, AUTO)
    if value in (AUTO, "nobind"):
        return None
    named = {c for rank in value.split("|") for c in parse_cpus(rank, OMP_BIND_ENV)}
    return tuple(sorted(named & set(allowed))) or None


def _rest(allowed: Sequence[int], taken: Sequence[int] | None) -> tuple[int, ...] | None:
    """The allowed CPUs that ``taken`` leaves; None (share everything) when it leaves none."""
    rest = tuple(c for c in allowed if c not in set(taken or ()))
    return rest or None


def pin(pid: int, cpus: Sequence[int] | None) -> None:
    """Restrict process ``pid`` (and every thread and child it starts later) to ``cpus``;
    None or empty leaves it alone. ``pid`` 0 is the calling process."""
    if cpus:
        os.sched_setaffinity(pid, cpus)


def tree_cpus(pid: int) -> list[int]:
    """The union of the CPUs every thread of ``pid`` and its descendants may run on, read back
    from the kernel (what the placement did, not what was asked)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    cpus: set[int] = set()
    for proc in procs:
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                cpus |= os.sched_getaffinity(thread.id)
            except OSError:  # the thread ended meanwhile
                continue
    return sorted(cpus)
