"""What a study's trials need and how many of them a cluster holds at once.

Checked before the first launch, so that a study the cluster cannot run stops with one line
(exit 2) instead of trials that wait forever for a node that does not exist.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.executor.protocol import Demand, demand_of
from tuner.search.checks import DEVICE_MULTIPLIERS
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.search.space import choices_of

AUTO = "auto"


def study_demands(config: TunerConfig, cpus_per_gpu: int = 0) -> list[Demand]:
    """The baseline's demand, then each device multiplier's values in the search space (on top
    of the fixed args): the trials the study will certainly ask for, at ``cpus_per_gpu`` (the
    executor's node share; see :func:`demand_of`)."""
    demands = [demand_of(config, resolve(LaunchSpec(), config.server), cpus_per_gpu)]
    for specs in config.search_space.values():
        for param, spec in specs.items():
            name = spec.name or param
            if spec.target != "arg" or name not in DEVICE_MULTIPLIERS:
                continue
            values = choices_of(spec) or [spec.low or 1, spec.high or 1]
            for value in values:
                launch = resolve(LaunchSpec(args={name: int(value)}), config.server)
                demands.append(demand_of(config, launch, cpus_per_gpu))
    return demands


def smallest(demands: Sequence[Demand]) -> Demand:
    return min(demands, key=lambda d: (d.gpus, d.cpus))


def holds(node: Demand, trial: Demand) -> int:
    """How many trials of ``trial`` one node of ``node`` runs at once."""
    by_gpu = node.gpus // trial.gpus if trial.gpus else node.cpus
    return min(by_gpu, node.cpus // max(trial.cpus, 1))


def resolve_slots(parallel: str, nodes: Sequence[Demand], demands: Sequence[Demand]) -> int:
    """``study.parallel`` as a number: ``auto`` is what the cluster holds of the study's smallest
    trial; a number larger than that is a ConfigError."""
    least = smallest(demands)
    capacity = sum(holds(node, least) for node in nodes)
    if parallel == AUTO:
        if capacity < 1:
            raise ConfigError(
                f"no node of the cluster can run a trial of {least.text()}",
                hint="add a node (or declare its CPUs: ray.num_cpus), or lower "
                "ray.cpus_per_gpu or workload.processes (or set ray.cpus_per_trial)",
            )
        return capacity
    wanted = int(parallel)
    if wanted > capacity:
        raise ConfigError(
            f"study.parallel={wanted} is larger than the cluster can place: its "
            f"{len(nodes)} node(s) hold {capacity} trial(s) of {least.text()} at once",
            hint=f"use study.parallel={max(capacity, 1)} or auto, or add nodes",
        )
    return wanted
