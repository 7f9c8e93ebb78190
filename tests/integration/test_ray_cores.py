"""A TP 8 trial's cores on a Ray node declared with 8 GPUs and 32 CPUs (the host has no GPU and
may have as few as 2 cores): Ray's scheduling, the node's core ledger, the trial's placement,
the stand-in server (tests/fakes/gpu_server.py) and real Locust all run for real.

The node's 32 CPUs are the ledger's slots, mapped onto the host's cores round-robin; the
assertions are on the slots each side was given and on the cores those slots are, so they hold
on any host.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.fakes.ray_study import (
    STANDIN,
    no_trial_left,
    ray_processes,
    server_lines,
    wait_gone,
    worker_env,
)
from tuner.composition import compose
from tuner.executor import TrialJob, demand_of, make_executor
from tuner.executor.cluster import loopback_only
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.trial.run import run_trial

loopback_only()  # before Ray is imported: the instance listens on loopback only
import ray  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
GPUS, CPUS, PROCESSES = 8, 32, 2


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    record = tmp_path_factory.mktemp("ray") / "servers.jsonl"
    ray.init(
        num_cpus=CPUS,
        num_gpus=GPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=worker_env(record),
    )
    started = ray_processes(psutil.Process())
    try:
        yield
    finally:
        ray.shutdown()
    assert not wait_gone(started), "Ray processes left running after shutdown"


def test_a_tp8_trials_vllm_gets_9_cores_or_more_and_its_client_others(
    node: None, tmp_path: Path
) -> None:
    config = compose(
        [*STANDIN, "name=cores", f"studies_dir={tmp_path}", f"workload.processes={PROCESSES}"]
    )
    launch = resolve(LaunchSpec(args={"tensor_parallel_size": GPUS}), config.server)
    said: list[str] = []
    executor = make_executor(config, run_trial, said.append)
    try:
        with no_trial_left():
            executor.submit(
                TrialJob(
                    "cores#0",
                    "tp8-0",
                    config,
                    launch,
                    tmp_path / "tp8-0",
                    "[tp8 #0]",
                    demand_of(config, launch),
                )
            )
            result = executor.wait()
    finally:
        executor.close()
    assert result.outcome.ok, f"{result.outcome.reason}: {result.outcome.message}"
    # C/G = 4 cores per GPU: the trial holds the node's 32 CPUs, not its 11 processes' count
    assert "[tp8 #0] submitted to Ray: 8 GPUs, 32 CPUs" in said
    devices = result.devices
    server, client = set(devices.server_slots), set(devices.client_slots)
    assert len(server) >= 1 + GPUS  # vLLM's API server and a worker per GPU
    assert len(client) == PROCESSES and server.isdisjoint(client)  # the client's own
    assert server | client == set(range(CPUS))
    # Each side runs on the cores its slots are (the node's cores, round-robin), as pinned
    host = sorted(os.sched_getaffinity(0))  # the raylet's, which this process started

    def cores(slots: set[int]) -> list[int]:
        return sorted({host[s % len(host)] for s in slots})

    placement = json.loads((tmp_path / "tp8-0" / "result.json").read_text())["placement"]
    assert placement["server"] == placement["server_read_back"] == cores(server)
    assert placement["client"] == cores(client)
    assert set(placement["client_read_back"]) <= set(cores(client))
    (seen,) = [r for r in server_lines(tmp_path / "tp8-0") if r["event"] == "start"]
    assert seen["cpus"] == cores(server) and seen["tp"] == GPUS
