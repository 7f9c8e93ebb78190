"""The simulated host's GPUs, seen through NVML's own call names.

tuner's telemetry imports ``pynvml``; with ``TUNER_NVML_MODULE=tuner.simulation.fake_nvml`` in its
environment it imports this module instead (:func:`tuner.telemetry.nvml._pynvml`). Only the
hardware is faked: a simulated server writes, per device it was given, a small state file
(utilization, memory in use, its pid), and the readings here come from those files, so a
device is busy exactly while a simulated server serves on it. Devices are named after the
declared system with "(simulated)" in the name, which reaches every fingerprint and report.

This module imports nothing of tuner: it stands in for a third-party library.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_CLOCK_SM = 1
COUNT_ENV = "TUNER_SIM_GPUS"
SYSTEM_ENV = "TUNER_SIM_SYSTEM"
STATE_ENV = "TUNER_SIM_STATE_DIR"
# What NVML reports of each system's GPU: its name and memory (MiB), as on a real one.
GPUS: dict[str, tuple[str, int]] = {
    "h100_sxm": ("NVIDIA H100 80GB HBM3", 81559),
    "h200_sxm": ("NVIDIA H200", 143771),
    "b200_sxm": ("NVIDIA B200", 183359),
    "a100_sxm": ("NVIDIA A100-SXM4-80GB", 81920),
    "l40s": ("NVIDIA L40S", 46068),
}
IDLE_W, BUSY_W = 90.0, 600.0
_T0 = time.time()
_ENERGY: dict[int, tuple[float, float]] = {}


class NVMLError(Exception):
    pass


def state_dir() -> Path:
    default = Path(tempfile.gettempdir()) / "tuner-simulated-gpus"
    return Path(os.environ.get(STATE_ENV) or default)


def system() -> str:
    return os.environ.get(SYSTEM_ENV, "h100_sxm")


def device_name(system_name: str) -> str:
    name, _ = GPUS.get(system_name, (system_name.upper(), 81559))
    return f"{name} (simulated)"


def memory_mib(system_name: str) -> int:
    return GPUS.get(system_name, ("", 81559))[1]


def uuid_of(index: int) -> str:
    return f"GPU-5a11-0000-0000-0000-{index:012d}"


def write_state(index: int, util_pct: float, mem_used_mib: float, pid: int) -> None:
    """A simulated server's reading of device ``index`` (atomically: a reader sees all or
    nothing)."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gpu-{index}.json"
    tmp = path.with_suffix(f".{pid}.tmp")
    tmp.write_text(json.dumps({"util": util_pct, "mem": mem_used_mib, "pid": pid}))
    tmp.replace(path)


def clear_state(index: int, pid: int) -> None:
    """Forget device ``index``'s reading if this server wrote it (it stopped)."""
    path = state_dir() / f"gpu-{index}.json"
    reading = _read(index)
    if reading and reading.get("pid") == pid:
        path.unlink(missing_ok=True)


def _read(index: int) -> dict[str, Any] | None:
    try:
        reading = json.loads((state_dir() / f"gpu-{index}.json").read_text())
    except (OSError, ValueError):
        return None
    if not _alive(int(reading.get("pid", 0))):
        return None  # a killed server's reading is not a busy GPU
    return dict(reading)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def _count() -> int:
    return int(os.environ.get(COUNT_ENV, "8"))


def _check(handle: int) -> int:
    if not 0 <= handle < _count():
        raise NVMLError("Invalid Argument")
    return handle


def nvmlInit() -> None:
    return None


def nvmlShutdown() -> None:
    return None


def nvmlSystemGetDriverVersion() -> str:
    return "simulated"


def nvmlDeviceGetCount() -> int:
    return _count()


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return _check(index)


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    for index in range(_count()):
        if uuid_of(index) == uuid:
            return index
    raise NVMLError("Not Found")


def nvmlDeviceGetUUID(handle: int) -> str:
    return uuid_of(_check(handle))


def nvmlDeviceGetIndex(handle: int) -> int:
    return _check(handle)


def nvmlDeviceGetName(handle: int) -> str:
    _check(handle)
    return device_name(system())


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    reading = _read(_check(handle)) or {}
    return SimpleNamespace(gpu=int(reading.get("util", 0)), memory=0)


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    reading = _read(_check(handle)) or {}
    total = memory_mib(system()) * 2**20
    used = min(int(float(reading.get("mem", 0)) * 2**20), total)
    return SimpleNamespace(used=used, total=total, free=total - used)


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    util = nvmlDeviceGetUtilizationRates(handle).gpu
    return int((IDLE_W + (BUSY_W - IDLE_W) * util / 100) * 1000)  # mW


def nvmlDeviceGetClockInfo(handle: int, clock: int) -> int:
    _check(handle)
    return 1980


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    """mJ since this process first asked, integrated at each reading's draw: a counter that
    only grows, as NVML's does."""
    now = time.time()
    last_t, total = _ENERGY.get(handle, (_T0, 0.0))
    total += (now - last_t) * nvmlDeviceGetPowerUsage(handle)
    _ENERGY[handle] = (now, total)
    return int(total)
