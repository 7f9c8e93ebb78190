"""The client's capacity store and the sizing rule of its processes
(tuner.loadgen.client_capacity)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.config import TunerConfig
from tuner.config.workload import WorkloadConfig
from tuner.loadgen import client_capacity as cap
from tuner.loadgen.client_capacity import ClientCapacity
from tuner.paths import client_capacity_file
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve


def _config(processes: int = 1, concurrency: int = 64, mode: str = "closed") -> TunerConfig:
    workload = WorkloadConfig(processes=processes, concurrency=concurrency, mode=mode)
    return replace(TunerConfig(), workload=workload)


@pytest.mark.parametrize(
    ("expected", "capacity", "floor", "want"),
    [
        (1_000, 10_000, 1, 1),  # a fifth of a core: one process
        (5_000, 10_000, 1, 1),  # exactly half: still one (2x headroom)
        (5_001, 10_000, 1, 2),
        (15_000, 10_000, 1, 3),
        (15_000, 10_000, 4, 4),  # the configured count is a floor
        (0.0, 10_000, 2, 2),  # nothing expected: as configured
        (float("nan"), 10_000, 1, 1),
    ],
)
def test_processes_carry_the_expected_events_at_twice_headroom(
    expected: float, capacity: float, floor: int, want: int
) -> None:
    assert cap.processes_for(expected, capacity, floor) == want


def test_a_raised_count_is_set_on_the_config_and_said() -> None:
    said: list[str] = []
    config = cap.sized(_config(), 15_000, said.append, capacity=10_000)
    assert config.workload.processes == 3
    assert said and "3 processes instead of 1" in said[0] and "15,000 events/s" in said[0]
    same = cap.sized(_config(processes=5), 15_000, said.append, capacity=10_000)
    assert same.workload.processes == 5 and len(said) == 1  # not raised: not said


def test_no_expectation_leaves_the_config_and_measures_nothing() -> None:
    config = _config()
    assert cap.sized(config, None) is config
    baseline = resolve(LaunchSpec(), config.server)
    assert cap.for_job(config, baseline.devices, {}) is config  # no plan estimate in the attrs


def test_the_plan_estimate_is_the_expected_rate() -> None:
    attrs = {"plan_tok_s_gpu": 2_000.0, "plan_tpot_ms": 10.0}
    # the server's 2 GPUs make 4,000 tok/s; 64 users at 10 ms could ask for 6,400
    assert cap.expected_from_plan(_config(), attrs, gpus=2) == pytest.approx(4_000)
    # 16 users at 10 ms ask for 1,600 only
    assert cap.expected_from_plan(_config(concurrency=16), attrs, 2) == pytest.approx(1_600)
    # an open loop is not bounded by users
    assert cap.expected_from_plan(_config(mode="open"), attrs, 2) == pytest.approx(4_000)
    assert cap.expected_from_plan(_config(), {"plan_tok_s_gpu": None}, 1) is None
    assert cap.expected_from_plan(_config(), {"plan_tpot_ms": float("nan")}, 1) is None


def test_a_job_is_sized_from_its_trials_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    cap.store(ClientCapacity(events_per_s=3_000.0))
    attrs = {"plan_tok_s_gpu": 2_000.0, "plan_tpot_ms": 5.0}
    config = replace(_config(), server=replace(TunerConfig().server, device="cuda"))
    launch = resolve(LaunchSpec(args={"tensor_parallel_size": 4}), config.server)
    sized = cap.for_job(config, launch.devices, attrs)
    # 4 GPUs x 2,000 = 8,000 tok/s, 64 users at 5 ms = 12,800: 8,000 expected, 2x / 3,000
    assert sized.workload.processes == 6


@pytest.mark.parametrize(
    ("processes", "events", "saturated", "want"),
    [
        (1, 900.0, False, None),  # under the capacity: the window counts
        (1, 1_500.0, False, 3),  # past it: 2x headroom
        (1, 400.0, True, 2),  # a full core anyway: at least one more
        (3, 2_400.0, False, None),  # 800 per process
        (2, 2_400.0, False, 5),
        (1, 50_000.0, False, cap.MAX_GROWTH),  # a wrong capacity grows in steps
    ],
)
def test_a_window_past_the_capacity_is_run_again_with_more(
    processes: int, events: float, saturated: bool, want: int | None
) -> None:
    assert cap.after_window(processes, events, 1_000.0, saturated) == want


def test_the_store_keeps_each_host_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    assert client_capacity_file() == tmp_path / "client-capacity.json"
    assert cap.load() is None
    cap.store(ClientCapacity(events_per_s=1234.5, host="a"), key="other|cpu|tuner 0")
    assert cap.load() is None  # another host's number is not this host's
    cap.store(ClientCapacity(events_per_s=2_000.0, cpu_cores=0.5))
    found = cap.load()
    assert found is not None and found.events_per_s == 2_000.0 and found.cpu_cores == 0.5
    data = json.loads(client_capacity_file().read_text())
    assert set(data) == {"other|cpu|tuner 0", cap.host_key()}
    assert f"tuner {cap.tuner_version()}" in cap.host_key()


def test_a_torn_store_is_no_capacity_and_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    client_capacity_file().write_text('{"half')
    assert cap.load() is None
    cap.store(ClientCapacity(events_per_s=10.0))
    assert cap.load() == ClientCapacity(events_per_s=10.0)


def test_the_first_need_measures_once_and_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    calls: list[int] = []

    def measure() -> ClientCapacity:
        calls.append(1)
        return ClientCapacity(events_per_s=4_321.0)

    assert cap.measured(measure) == 4_321.0
    assert cap.measured(measure) == 4_321.0
    assert calls == [1]
    stored = cap.load()
    assert stored is not None and stored.measured_at > 0
