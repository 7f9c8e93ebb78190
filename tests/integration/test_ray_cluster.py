"""A two-node Ray cluster on this host (Ray's own ray.cluster_utils.Cluster: two raylets), one
declared GPU each: trials spread over both nodes; one node killed mid-trial gives an
``executor_lost`` trial, and the study completes its budget on the other.

The node is killed as a crashed node dies: its raylet and Ray workers killed at once, nothing
stopped cleanly. The trial's own processes (the stand-in server, Locust), in sessions of their
own, outlive the worker; the trial's guard on the node must stop them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest

from tests.fakes.ray_study import (
    STANDIN,
    no_trial_left,
    ray_processes,
    records,
    running,
    wait_gone,
    worker_env,
)
from tuner.composition import compose
from tuner.executor import REASON_EXECUTOR_LOST
from tuner.executor.cluster import loopback_only
from tuner.schema import Role, TrialAttr
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.runner import StudyRunner

loopback_only()  # before Ray is imported: every raylet on 127.0.0.1
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Any, Path]]:
    record = tmp_path_factory.mktemp("ray") / "servers.jsonl"
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1})
    doomed = nodes.add_node(num_cpus=4, num_gpus=1)
    ray.init(
        address=nodes.address, runtime_env=worker_env(record, startup_s=2.0), log_to_driver=False
    )
    started = ray_processes(psutil.Process())
    try:
        yield nodes, doomed, record
    finally:
        ray.shutdown()
        nodes.shutdown()
    assert not wait_gone(started), "Ray processes left running after shutdown"


def _crash(nodes: Cluster, node: Any) -> None:
    """Kill a node's raylet and its Ray workers (SIGKILL), then let the cluster forget it."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    workers = [
        p
        for p in raylet.children()
        if "ray::" in p.name() or "default_worker" in " ".join(p.cmdline())
    ]
    for proc in [*workers, raylet]:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    nodes.remove_node(node, allow_graceful=False)


def _kill_mid_trial(
    nodes: Cluster, node: Any, record: Path, said: list[str], done: threading.Event
) -> None:
    """Once the node runs its second stage trial (the first one finished there), crash it.
    It watches for as long as the study runs: a fixed 180 s once ran out on a busy host while
    the node's second trial had still to start."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    mine: set[int] = set()
    while not done.is_set():
        with contextlib.suppress(psutil.Error):
            on_node = {p.pid for p in raylet.children(recursive=True)}
            seen = records(record)
            mine |= {
                r["pid"] for r in seen if r["pid"] in on_node and "/batching-" in r["trial_dir"]
            }
            stopped = {r["pid"] for r in seen if r["event"] == "stop"}
            if len(mine) >= 2 and mine - stopped:
                time.sleep(1.0)  # its load is running
                said.append("test: crashing the node")
                _crash(nodes, node)
                return
        time.sleep(0.2)


def test_trials_spread_over_two_nodes_and_a_lost_node_costs_one_trial(
    cluster: tuple[Cluster, Any, Path], tmp_path: Path
) -> None:
    nodes, doomed, record = cluster
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    config = compose(
        [
            *STANDIN,
            "name=two",
            f"studies_dir={tmp_path}",
            "search_space=[batching]",
            "study.stages=[batching]",
            "study.trials_per_stage=4",
            "study.parallel=2",
            "sampler=random",
        ]
    )
    said: list[str] = []
    done = threading.Event()
    killer = threading.Thread(target=_kill_mid_trial, args=(nodes, doomed, record, said, done))
    killer.start()
    try:
        with no_trial_left(timeout_s=30):
            result = StudyRunner(config, Evaluator(config), {"t": 2}, said.append).run()
    finally:
        done.set()
        killer.join()
    assert "test: crashing the node" in said
    storage = f"sqlite:///{tmp_path}/two/optuna.db"
    stage = optuna.load_study(study_name="two:batching", storage=storage)
    lost = [
        t
        for t in stage.trials
        if t.user_attrs.get(TrialAttr.FAILURE_REASON) == REASON_EXECUTOR_LOST
    ]
    assert len(lost) == 1 and lost[0].state == optuna.trial.TrialState.FAIL
    assert "NodeDiedError" in lost[0].user_attrs[TrialAttr.FAILURE_MESSAGE]
    launched = [
        t
        for t in stage.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH
        and TrialAttr.REUSED_FROM not in t.user_attrs
    ]
    assert len(launched) == 4 and all(t.user_attrs[TrialAttr.STATUS] == "ok" for t in launched)
    used = {t.user_attrs["devices"]["node"] for t in launched}
    assert len(used) == 2  # before the crash, the other node ran trials too
    assert [d.stage for d in result.decisions] == ["batching"]
    assert not running([r["pid"] for r in records(record)])
