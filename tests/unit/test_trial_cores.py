"""A trial's cores on a Ray node: how many it claims, and how they are shared out between vLLM
and the load generator. Declared nodes are ledgers of core ids, so nothing here depends on the
host's core count; tests/integration/test_ray_cores.py runs the same on a Ray instance.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner.config import TunerConfig
from tuner.executor import Demand, TrialDevices, demand_of
from tuner.executor.cores import CoreLedger, TrialCores
from tuner.executor.protocol import node_share
from tuner.executor.remote import on_devices
from tuner.host.placement import Placement, plan
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import ResolvedLaunch, resolve

NODE = Demand(gpus=8, cpus=32)  # a declared node: 8 GPUs, 32 cores


def _gpu_config(processes: int = 2) -> TunerConfig:
    config = TunerConfig()
    config.server.device = "cuda"
    config.workload.processes = processes
    return config


def _tp(size: int) -> ResolvedLaunch:
    return resolve(LaunchSpec(args={"tensor_parallel_size": size}), TunerConfig().server)


def _claim(ledger: CoreLedger, owner: str, config: TunerConfig, demand: Demand) -> TrialCores:
    slots = ledger.acquire_slots(owner, os.getpid(), demand.cpus)
    return TrialCores.of(ledger, slots, config.workload.processes)


def test_a_tp8_trial_gives_vllm_at_least_9_cores_and_the_client_others(tmp_path: Path) -> None:
    config = _gpu_config(processes=2)
    demand = demand_of(config, _tp(8), node_share([NODE]))
    assert demand == Demand(8, 32)  # C/G = 4 cores per GPU: the whole node
    ledger = CoreLedger(tmp_path / "node.json", cores=range(NODE.cpus), slots=NODE.cpus)
    cores = _claim(ledger, "tp8", config, demand)
    server, client = set(cores.server_slots), set(cores.client_slots)
    assert len(server) >= 1 + 8  # vLLM's API server and its 8 workers, a core each at least
    assert len(client) == 2 and server.isdisjoint(client)  # one per Locust process, its own
    assert server | client == set(range(32))
    assert cores.sides == Placement(tuple(range(30)), (30, 31))
    # the trial's own placement pins each side there, as on a local host
    placed, _ = on_devices(config, _tp(8), TrialDevices("ray", cpus=list(cores.cores)), cores.sides)
    assert (placed.placement.server_cpus, placed.placement.client_cpus) == ("0-29", "30-31")
    assert plan(placed.placement, "cuda", {}, 2, allowed=cores.cores) == cores.sides
    assert config.placement.server_cpus == "auto"  # the driver's config is untouched


def test_trials_side_by_side_hold_disjoint_cores_each_split_in_two(tmp_path: Path) -> None:
    config = _gpu_config(processes=1)
    ledger = CoreLedger(tmp_path / "node.json", cores=range(NODE.cpus), slots=NODE.cpus)
    demand = demand_of(config, _tp(4), node_share([NODE]))
    assert demand == Demand(4, 16)
    a, b = (_claim(ledger, name, config, demand) for name in "ab")
    sides = [set(a.server_slots), set(a.client_slots), set(b.server_slots), set(b.client_slots)]
    assert sum(len(s) for s in sides) == 32 == len(set().union(*sides))  # nothing shared


def test_a_node_declaring_more_cpus_than_cores_splits_the_declared_ones(tmp_path: Path) -> None:
    """A test host declares 32 CPUs on 2 cores: the sides are disjoint as Ray counts the
    node's CPUs, and share the real cores round-robin (the ledger's rule)."""
    config = _gpu_config(processes=1)
    ledger = CoreLedger(tmp_path / "node.json", cores=[4, 5], slots=NODE.cpus)
    cores = _claim(ledger, "tp8", config, demand_of(config, _tp(8), node_share([NODE])))
    assert len(cores.server_slots) == 31 and cores.client_slots == (31,)
    assert cores.sides == Placement((4, 5), (5,)) and cores.cores == (4, 5)


def test_a_trial_of_one_core_runs_both_sides_on_it(tmp_path: Path) -> None:
    config = _gpu_config(processes=1)
    config.ray.cpus_per_trial = 1  # the user's exact count
    ledger = CoreLedger(tmp_path / "node.json", cores=range(4), slots=4)
    cores = _claim(ledger, "one", config, demand_of(config, _tp(8), node_share([NODE])))
    assert cores.server_slots == cores.client_slots == (0,)
    assert cores.sides == Placement(None, None)
    placed, _ = on_devices(config, _tp(8), TrialDevices("ray", cpus=[0]), cores.sides)
    assert placed.placement == config.placement  # auto: nothing to pin apart on one core


def test_a_side_the_user_left_unpinned_stays_so() -> None:
    config = _gpu_config(processes=1)
    config.placement.client_cpus = "all"
    sides = Placement((0, 1, 2), (3,))
    placed, _ = on_devices(config, _tp(2), TrialDevices("ray", cpus=[0, 1, 2, 3]), sides)
    assert (placed.placement.server_cpus, placed.placement.client_cpus) == ("0-2", "all")


def test_a_cpu_servers_ranks_bind_to_the_servers_cores_only(tmp_path: Path) -> None:
    config = TunerConfig()
    config.server.device, config.workload.processes = "cpu", 1
    spec = LaunchSpec(args={"tensor_parallel_size": 2}, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    launch = resolve(spec, config.server)
    demand = demand_of(config, launch)
    assert demand == Demand(0, 3)  # a core per rank and one for Locust
    ledger = CoreLedger(tmp_path / "node.json", cores=[10, 11, 12], slots=3)
    cores = _claim(ledger, "cpu", config, demand)
    assert cores.sides == Placement((10, 11), (12,))
    placed, bound = on_devices(config, launch, TrialDevices("ray", cpus=[10, 11, 12]), cores.sides)
    assert bound.env["VLLM_CPU_OMP_THREADS_BIND"] == "10|11"  # never on the client's core
    assert (placed.placement.server_cpus, placed.placement.client_cpus) == ("10-11", "12")
