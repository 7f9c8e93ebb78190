"""The executor seam without a cluster: what a trial needs, what a cluster holds, which cores a
trial gets, the local executor, and the samplers' settings for proposals made in parallel.

Ray's own scheduling is exercised for real in tests/integration/test_ray_*.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.config import ParamSpec, SamplerConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.executor import Demand, TrialJob, demand_of, make_executor
from tuner.executor.cluster_fit import resolve_slots, study_demands
from tuner.executor.cores import CoreLedger, rebind
from tuner.executor.local import LocalExecutor
from tuner.executor.protocol import at_share, check_demands, node_share
from tuner.schema import TrialStatus
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import ResolvedLaunch, resolve
from tuner.search.samplers import for_parallel, make_sampler
from tuner.trial.outcome import TrialOutcome


def _gpu_config(**study: Any) -> TunerConfig:
    config = TunerConfig()
    config.server.device = "cuda"
    config.workload.processes = 2
    tp = ParamSpec(type="categorical", choices=[1, 2, 4, 8])
    config.search_space = {"parallelism": {"tensor_parallel_size": tp}}
    for key, value in study.items():
        setattr(config.study, key, value)
    return config


def test_a_trial_needs_its_parallel_sizes_in_gpus_and_its_processes_in_cores() -> None:
    config = _gpu_config()
    launch = resolve(
        LaunchSpec(args={"tensor_parallel_size": 4, "pipeline_parallel_size": 2}), config.server
    )
    # vLLM's API server, a worker per GPU, and the 2 client processes
    assert demand_of(config, launch) == Demand(gpus=8, cpus=1 + 8 + 2)
    assert demand_of(config, launch, cpus_per_gpu=4) == Demand(gpus=8, cpus=32)  # a node's share
    assert demand_of(config, launch, cpus_per_gpu=1) == Demand(gpus=8, cpus=11)  # never fewer
    config.ray.cpus_per_gpu = 2  # the user's share wins over the executor's
    assert demand_of(config, launch, cpus_per_gpu=4) == Demand(gpus=8, cpus=16)
    config.ray.cpus_per_trial = 5  # exactly that, whatever the trial
    assert demand_of(config, launch, cpus_per_gpu=4) == Demand(gpus=8, cpus=5)
    config.ray.cpus_per_trial = 0
    config.server.device = "cpu"  # vLLM-CPU computes on cores: one per rank, none on GPUs
    assert demand_of(config, launch) == Demand(gpus=0, cpus=10)
    config.ray.cpus_per_trial = 1
    assert demand_of(config, launch) == Demand(gpus=0, cpus=1)


def test_the_study_demands_cover_the_baseline_and_every_parallel_size() -> None:
    demands = study_demands(_gpu_config())
    assert sorted(d.gpus for d in demands) == [1, 1, 2, 4, 8]  # the baseline is TP 1
    at_share = study_demands(_gpu_config(), cpus_per_gpu=4)
    assert sorted((d.gpus, d.cpus) for d in at_share) == [(1, 4), (1, 4), (2, 8), (4, 16), (8, 32)]


def test_a_gpus_share_of_cores_is_the_least_of_the_gpu_nodes() -> None:
    assert node_share([Demand(8, 32)]) == 4
    assert node_share([Demand(0, 4), Demand(8, 32), Demand(4, 8)]) == 2  # a head without GPUs
    assert node_share([Demand(0, 16)]) == 0  # a CPU cluster: no GPU trial to size
    assert at_share(Demand(2, 9), 4) == Demand(2, 9) and at_share(Demand(0, 3), 4) == Demand(0, 3)


def test_parallel_auto_is_what_the_cluster_holds_of_the_smallest_trial() -> None:
    demands = [Demand(1, 3), Demand(8, 3)]
    nodes = [Demand(8, 64), Demand(4, 6)]
    assert resolve_slots("auto", nodes, demands) == 8 + 2  # the small node is short of cores
    assert resolve_slots("3", nodes, demands) == 3
    with pytest.raises(
        ConfigError,
        match=r"study.parallel=11 is larger than the cluster can "
        r"place: its 2 node\(s\) hold 10 trial\(s\) of 1 GPU, 3 CPUs",
    ):
        resolve_slots("11", nodes, demands)


def test_candidates_larger_than_every_node_are_left_to_the_screen() -> None:
    """TP 8 on nodes of 4 GPUs is a candidate the study screens unlaunched, not a reason to
    refuse the study; a baseline no node holds is."""
    config = _gpu_config()
    beyond = check_demands(config, study_demands(config), Demand(4, 64), "the Ray cluster")
    assert beyond == [Demand(8, 11)]
    config.server.args["tensor_parallel_size"] = 8
    with pytest.raises(
        ConfigError,
        match="needs 8 GPUs, 11 CPUs on one node, and the largest "
        "node of the Ray cluster has 4 GPUs, 64 CPUs",
    ):
        check_demands(config, study_demands(config), Demand(4, 64), "the Ray cluster")


def test_a_trial_whose_gpus_fit_but_not_its_cores_is_refused() -> None:
    config = _gpu_config()
    with pytest.raises(ConfigError, match="needs 4 GPUs, 7 CPUs on one node"):
        check_demands(config, study_demands(config), Demand(8, 6), "the Ray cluster")


def test_the_local_executor_runs_one_trial_at_a_time_only() -> None:
    with pytest.raises(ConfigError, match=r"study\.parallel=2 needs study\.executor=ray"):
        make_executor(_gpu_config(parallel="2"), lambda *a, **k: None, print)
    with pytest.raises(ConfigError, match=r"study\.executor='slurm' is unknown"):
        make_executor(_gpu_config(executor="slurm"), lambda *a, **k: None, print)


def test_the_local_executor_runs_the_trial_in_wait(tmp_path: Path) -> None:
    said: list[str] = []
    calls: list[str] = []

    def trial(
        config: TunerConfig, launch: ResolvedLaunch, paths: Any, trial_id: str, progress: Any
    ) -> TrialOutcome:
        calls.append(trial_id)
        progress("hello")
        return TrialOutcome(trial_id, TrialStatus.OK, ["vllm"], launch.record())

    config = _gpu_config()
    config.server.cuda_visible_devices = "1,3"
    executor = LocalExecutor(config, trial, said.append)
    launch = resolve(LaunchSpec(), config.server)
    job = TrialJob("s#0", "stage-0", config, launch, tmp_path, "[stage #0]", Demand(1, 3))
    assert executor.fits(job.demand)
    executor.submit(job)
    assert calls == [] and not executor.fits(job.demand)  # nothing runs before wait()
    result = executor.wait()
    assert calls == ["stage-0"] and said == ["[stage #0] hello"] and executor.in_flight == 0
    assert result.key == "s#0" and result.devices.cuda_visible_devices == "1,3"
    assert executor.largest_node().gpus == 2  # the GPUs its server may see, not the host's


# ---------------------------------------------------------------------------- cores
def test_trials_on_one_node_get_disjoint_cores(tmp_path: Path) -> None:
    ledger = CoreLedger(tmp_path / "node.json", cores=range(8), slots=8)
    a = ledger.acquire("a", os.getpid(), 3)
    b = ledger.acquire("b", os.getpid(), 3)
    assert a == (0, 1, 2) and b == (3, 4, 5)
    ledger.release("a")
    assert ledger.acquire("c", os.getpid(), 2) == (0, 1)  # freed cores are taken again


def test_a_dead_workers_claim_is_free_again(tmp_path: Path) -> None:
    ledger = CoreLedger(tmp_path / "node.json", cores=range(4), slots=4)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    ledger.acquire("killed", int(gone.stdout), 4)
    assert ledger.acquire("next", os.getpid(), 2) == (0, 1)
    assert set(json.loads((tmp_path / "node.json").read_text())) == {"next"}


def test_a_node_declaring_more_cpus_than_cores_shares_them_round_robin(tmp_path: Path) -> None:
    ledger = CoreLedger(tmp_path / "node.json", cores=[4, 5], slots=8)
    assert ledger.acquire("a", os.getpid(), 1) == (4,)
    assert ledger.acquire("b", os.getpid(), 1) == (5,)
    assert ledger.acquire("c", os.getpid(), 1) == (4,)  # slot 2 wraps onto core 4


def test_a_cpu_servers_thread_binding_moves_onto_its_cores() -> None:
    assert rebind("0-3|4-7", (8, 9, 10, 11)) == "8-9|10-11"
    assert rebind("0|1", (5,)) == "5|5"
    assert rebind("auto", (5,)) == "auto"
    with pytest.raises(ConfigError, match="VLLM_CPU_OMP_THREADS_BIND"):
        rebind("0|x", (1, 2))


# ---------------------------------------------------------------------------- samplers
def test_tpe_proposes_with_a_constant_liar_when_trials_run_in_parallel() -> None:
    space = {"x": ParamSpec(type="int", low=1, high=8)}
    assert for_parallel(SamplerConfig("tpe")).options == {"constant_liar": True}
    assert for_parallel(SamplerConfig("tpe", options={"constant_liar": False})).options == {
        "constant_liar": False  # the user's choice stands
    }
    assert for_parallel(SamplerConfig("nsga2")).options == {}  # it has no such option
    parallel = make_sampler(SamplerConfig("tpe"), space, 0, parallel=True)
    refused = SamplerConfig("tpe", options={"constant_liar": False})
    assert _liar(parallel) and not _liar(make_sampler(refused, space, 0, parallel=True))


def _liar(sampler: Any) -> bool:
    """TPESampler keeps its constructor's options; read the one this test is about."""
    return bool(vars(sampler).get("_constant_liar"))
