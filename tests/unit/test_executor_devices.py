"""A trial's GPUs end to end, without GPUs: NVML faked at the ``pynvml`` call boundary by the
simulated host's (tuner.simulation.fake_nvml: 8 GPUs, busy where a state file says so, idle
elsewhere), everything above it real.

A trial's server sees ``server.cuda_visible_devices`` and its telemetry samples exactly those
GPUs, opened by UUID: an idle GPU beside them would add its power to the trial's energy.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuner.config import TelemetryConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.executor import TrialDevices
from tuner.executor.remote import on_devices
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.simulation import fake_nvml
from tuner.telemetry import Telemetry
from tuner.telemetry.nvml import NVML_MODULE_ENV, NvmlSampler, visible_uuids
from tuner.trial.run import _gpus, with_device_order

uuid = fake_nvml.uuid_of  # GPU i's UUID, as NVML reports it


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tuner's telemetry reads 8 simulated GPUs, all idle until a test makes one busy."""
    monkeypatch.setenv(NVML_MODULE_ENV, fake_nvml.__name__)
    monkeypatch.setenv(fake_nvml.COUNT_ENV, "8")
    monkeypatch.setenv(fake_nvml.STATE_ENV, str(tmp_path / "gpus"))


def busy(index: int, util_pct: float) -> None:
    """GPU ``index`` serving, as a simulated server on it says (this process: alive)."""
    fake_nvml.write_state(index, util_pct, 1000.0, os.getpid())


@pytest.mark.usefixtures("nvml")
def test_visible_devices_resolve_to_uuids() -> None:
    assert visible_uuids(f"2,{uuid(5)}") == [uuid(2), uuid(5)]
    assert visible_uuids(None) is None  # unset: the server sees every GPU
    with pytest.raises(ConfigError, match="GPU 9 does not exist"):
        visible_uuids("9")
    with pytest.raises(ConfigError, match="no GPU has the UUID 'GPU-nope'"):
        visible_uuids("GPU-nope")


@pytest.mark.usefixtures("nvml")
def test_the_sampler_reads_only_the_servers_gpus() -> None:
    busy(2, 100.0)
    busy(3, 100.0)  # another server's GPU beside them
    busy(6, 50.0)
    sampler = NvmlSampler(interval_s=0.05, devices=[uuid(6), "2"])
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    summary = sampler.summary()
    assert sampler.sampled == [uuid(2), uuid(6)]
    assert set(sampler.samples["gpu"]) == {2, 6}
    assert summary["gpus"] == 2.0
    # Each GPU's own readings under its index, and no idle or other server's GPU's power added:
    # GPU 2 draws full power, GPU 6 half-way between idle and full.
    assert (summary["gpu2_util_mean_pct"], summary["gpu6_util_mean_pct"]) == (100.0, 50.0)
    half = (fake_nvml.IDLE_W + fake_nvml.BUSY_W) / 2
    assert summary["power_mean_w"] == pytest.approx(fake_nvml.BUSY_W + half)
    every = NvmlSampler(interval_s=0.05)
    every.start()
    every.stop()
    assert every.summary()["gpus"] == 8.0  # what a trial sampled before: every GPU


@pytest.mark.usefixtures("nvml")
def test_a_trial_samples_its_servers_gpus_in_pci_order() -> None:
    config = TunerConfig()
    config.server.device = "cuda"
    config.server.cuda_visible_devices = "3,4"
    ordered = with_device_order(config)
    assert ordered.server.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER" not in config.server.env  # the caller's config is untouched
    assert _gpus(ordered) == ["3", "4"]
    telemetry = Telemetry(TelemetryConfig(interval_s=0.05), gpu_devices=_gpus(ordered))
    with telemetry:
        time.sleep(0.15)
    assert telemetry.summary().gpu_devices == [uuid(3), uuid(4)]
    config.server.device = "cpu"  # a CPU server's cost has no GPU in it
    assert _gpus(config) == []
    assert Telemetry(TelemetryConfig(), gpu_devices=_gpus(config)).gpu is None


def test_a_remote_trial_runs_on_its_assigned_devices() -> None:
    config = TunerConfig()
    config.server.device = "cuda"
    devices = TrialDevices("ray", cuda_visible_devices="4,5", cpus=[6, 7])
    placed, _ = on_devices(config, resolve(LaunchSpec(), config.server), devices)
    assert placed.server.cuda_visible_devices == "4,5"
    assert config.server.cuda_visible_devices is None  # the driver's config is untouched
    config.server.device = "cpu"
    bound = resolve(LaunchSpec(env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}), config.server)
    _, moved = on_devices(config, bound, TrialDevices("ray", cpus=[6, 7]))
    assert moved.env["VLLM_CPU_OMP_THREADS_BIND"] == "6|7"  # the trial's cores, not 0 and 1
