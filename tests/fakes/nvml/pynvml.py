"""A stand-in for ``nvidia-ml-py`` (imported as ``pynvml``) on a host without GPUs: NVML faked
at its call boundary, nothing above it. Put this folder first on a process's PYTHONPATH (a Ray
worker's, through its runtime_env) and tuner's telemetry sees ``TUNER_FAKE_NVML_GPUS`` GPUs
(default 8) with UUIDs ``GPU-fake-0000``... and constant readings (GPU i draws 100 + i W)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

NVML_CLOCK_SM = 1
_T0 = time.time()


class NVMLError(Exception):
    pass


def _count() -> int:
    return int(os.environ.get("TUNER_FAKE_NVML_GPUS", "8"))


def _check(handle: int) -> int:
    if not 0 <= handle < _count():
        raise NVMLError("Invalid Argument")
    return handle


def nvmlInit() -> None:
    return None


def nvmlShutdown() -> None:
    return None


def nvmlSystemGetDriverVersion() -> str:
    return "999.0-fake"


def nvmlDeviceGetCount() -> int:
    return _count()


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return _check(index)


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    for index in range(_count()):
        if nvmlDeviceGetUUID(index) == uuid:
            return index
    raise NVMLError("Not Found")


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-fake-{_check(handle):04d}"


def nvmlDeviceGetIndex(handle: int) -> int:
    return _check(handle)


def nvmlDeviceGetName(handle: int) -> str:
    return "Fake H100"


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=50, memory=10)


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    return SimpleNamespace(used=2**30, total=80 * 2**30, free=79 * 2**30)


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return (100 + _check(handle)) * 1000  # mW


def nvmlDeviceGetClockInfo(handle: int, clock: int) -> int:
    return 1980


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    return int((time.time() - _T0) * (100 + _check(handle)) * 1000)  # mJ
