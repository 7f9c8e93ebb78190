"""A trial's GPUs end to end, without GPUs: NVML faked at the ``pynvml`` call boundary
(tests/fakes/nvml/pynvml.py: 8 GPUs, GPU i draws 100 + i W), everything above it real.

A trial's server sees ``server.cuda_visible_devices`` and its telemetry samples exactly those
GPUs, opened by UUID: an idle GPU beside them would add its power to the trial's energy.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tuner.config import TelemetryConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.executor import TrialDevices
from tuner.executor.remote import on_devices
from tuner.search.launch import LaunchSpec
from tuner.telemetry import Telemetry
from tuner.telemetry.nvml import NvmlSampler, visible_uuids
from tuner.trial.run import _gpus, with_device_order

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "nvml" / "pynvml.py"


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("pynvml", FAKE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_visible_devices_resolve_to_uuids(nvml: ModuleType) -> None:
    assert visible_uuids("2,GPU-fake-0005") == ["GPU-fake-0002", "GPU-fake-0005"]
    assert visible_uuids(None) is None  # unset: the server sees every GPU
    with pytest.raises(ConfigError, match="GPU 9 does not exist"):
        visible_uuids("9")
    with pytest.raises(ConfigError, match="no GPU has the UUID 'GPU-nope'"):
        visible_uuids("GPU-nope")


def test_the_sampler_reads_only_the_servers_gpus(nvml: ModuleType) -> None:
    sampler = NvmlSampler(interval_s=0.05, devices=["GPU-fake-0006", "2"])
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    summary = sampler.summary()
    assert sampler.sampled == ["GPU-fake-0002", "GPU-fake-0006"]
    assert set(sampler.samples["gpu"]) == {2, 6}
    assert summary["gpus"] == 2.0
    assert summary["power_mean_w"] == pytest.approx(102 + 106)  # not 8 GPUs' idle power
    every = NvmlSampler(interval_s=0.05)
    every.start()
    every.stop()
    assert every.summary()["gpus"] == 8.0  # what a trial sampled before: every GPU


def test_a_trial_samples_its_servers_gpus_in_pci_order(nvml: ModuleType) -> None:
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
    assert telemetry.summary().gpu_devices == ["GPU-fake-0003", "GPU-fake-0004"]
    config.server.device = "cpu"  # a CPU server's cost has no GPU in it
    assert _gpus(config) == []
    assert Telemetry(TelemetryConfig(), gpu_devices=_gpus(config)).gpu is None


def test_a_remote_trial_runs_on_its_assigned_devices() -> None:
    config = TunerConfig()
    config.server.device = "cuda"
    devices = TrialDevices("ray", cuda_visible_devices="4,5", cpus=[6, 7])
    placed, _ = on_devices(config, LaunchSpec(), devices)
    assert placed.server.cuda_visible_devices == "4,5"
    assert config.server.cuda_visible_devices is None  # the driver's config is untouched
    config.server.device = "cpu"
    bound = LaunchSpec(env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    _, moved = on_devices(config, bound, TrialDevices("ray", cpus=[6, 7]))
    assert moved.env["VLLM_CPU_OMP_THREADS_BIND"] == "6|7"  # the trial's cores, not 0 and 1
