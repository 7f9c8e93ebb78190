"""CPU placement: which CPUs the server and the client get, and that a child really runs there."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tuner.config import PlacementConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.host.children import reap, spawn
from tuner.host.placement import (
    Placement,
    for_trial,
    format_cpus,
    parse_cpus,
    pin,
    plan,
    split,
    tree_cpus,
)

AUTO = PlacementConfig()


def test_cpu_lists_parse_and_format_like_taskset() -> None:
    assert parse_cpus("0-3,6", "x") == (0, 1, 2, 3, 6)
    assert parse_cpus(" 5, 1-2 ,1", "x") == (1, 2, 5)
    assert format_cpus([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_cpus(parse_cpus("3", "x")) == "3"


@pytest.mark.parametrize("bad", ["", "a", "3-1", "-1", "1,,2", "0-"])
def test_a_bad_cpu_list_is_a_config_error_naming_the_key(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"placement\.server_cpus=.* is not a CPU list"):
        parse_cpus(bad, "placement.server_cpus")


def test_auto_on_a_cpu_server_gives_the_client_the_last_cpu_and_vllm_the_rest() -> None:
    assert plan(AUTO, "cpu", {}, 1, allowed=[0, 1]) == Placement((0,), (1,))
    assert plan(AUTO, "cpu", {}, 1, allowed=[2, 3, 5, 7]) == Placement((2, 3, 5), (7,))
    # one CPU per Locust process, but never all of them
    assert plan(AUTO, "cpu", {}, 3, allowed=range(8)) == Placement((0, 1, 2, 3, 4), (5, 6, 7))
    assert plan(AUTO, "cpu", {}, 4, allowed=[0, 1]) == Placement((0,), (1,))


def test_auto_on_a_gpu_server_keeps_the_client_off_vllms_cores_too() -> None:
    # vLLM's API server and GPU workers are CPU-bound processes; Locust beside them delays both
    assert plan(AUTO, "cuda", {}, 2, allowed=range(8)) == Placement(tuple(range(6)), (6, 7))
    # a CPU server's thread binding says nothing about a GPU server
    tp2 = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert plan(AUTO, "cuda", tp2, 1, allowed=range(4)) == Placement((0, 1, 2), (3,))


def test_split_gives_each_client_process_a_cpu_and_the_server_the_rest() -> None:
    assert split(range(32), 2) == Placement(tuple(range(30)), (30, 31))
    assert split([3, 9], 5) == Placement((3,), (9,))  # never every CPU to the client
    assert split([7], 1) == Placement(None, None)  # one CPU: nothing to split


def test_auto_pins_nothing_on_a_single_cpu() -> None:
    assert plan(AUTO, "cuda", {}, 1, allowed=[0]) == Placement(None, None)
    assert plan(AUTO, "cpu", {}, 1, allowed=[0]) == Placement(None, None)
    assert plan(AUTO, "cpu", {}, 1, allowed=[0]).describe() == "server and client on every CPU"


def test_vllms_own_thread_binding_decides_where_the_server_runs() -> None:
    tp2 = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # conf/search_space/parallelism_cpu.yaml
    assert plan(AUTO, "cpu", tp2, 1, allowed=[0, 1]) == Placement((0, 1), None)
    assert plan(AUTO, "cpu", tp2, 1, allowed=range(4)) == Placement((0, 1), (2, 3))
    wide = {"VLLM_CPU_OMP_THREADS_BIND": "0-5"}
    assert plan(AUTO, "cpu", wide, 1, allowed=range(8)) == Placement(tuple(range(6)), (6, 7))
    for value in ("auto", "nobind"):
        env = {"VLLM_CPU_OMP_THREADS_BIND": value}
        assert plan(AUTO, "cpu", env, 1, allowed=[0, 1]) == Placement((0,), (1,))


def test_explicit_lists_win_and_all_means_not_pinned() -> None:
    manual = PlacementConfig(server_cpus="0-2", client_cpus="3")
    assert plan(manual, "cuda", {}, 1, allowed=range(4)) == Placement((0, 1, 2), (3,))
    only_server = PlacementConfig(server_cpus="1-3")
    assert plan(only_server, "cpu", {}, 1, allowed=range(4)) == Placement((1, 2, 3), (0,))
    off = PlacementConfig(server_cpus="all", client_cpus="all")
    assert plan(off, "cpu", {}, 1, allowed=range(4)) == Placement(None, None)
    client_free = PlacementConfig(client_cpus="all")
    assert plan(client_free, "cpu", {}, 1, allowed=range(4)) == Placement(None, None)
    assert Placement((0,), None).describe() == "server on CPUs 0, client on every CPU"


def test_a_cpu_outside_the_allowed_set_is_refused_at_validation() -> None:
    cfg = TunerConfig()
    cfg.server.model, cfg.study.stages = "m", []
    cfg.placement.client_cpus = str(max(os.sched_getaffinity(0)) + 1)
    cfg.validate()  # the config itself is well formed; this host cannot place it
    with pytest.raises(ConfigError, match=r"placement\.client_cpus=.*may not use \(allowed: "):
        for_trial(cfg)


def test_spawn_pins_the_child_and_its_children_threads_included(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    code = (
        "import subprocess, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print('ready', flush=True); time.sleep(30)\n"
    )
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", code], dict(os.environ), log, cpus=allowed[-1:])
    try:
        deadline = time.monotonic() + 10
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree_cpus(proc.pid) == allowed[-1:]
    finally:
        reap(proc, 1.0)
    assert tree_cpus(proc.pid) == []  # gone: nothing to read back


def test_pin_with_no_cpus_leaves_the_affinity_alone() -> None:
    before = os.sched_getaffinity(0)
    pin(0, None)
    pin(0, [])
    assert os.sched_getaffinity(0) == before
