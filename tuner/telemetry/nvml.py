"""GPU telemetry through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Everything here degrades instead of failing: on a machine without a GPU or driver (NVML init
fails), :func:`gpu_count` is 0, :func:`gpu_inventory` is empty, and a :class:`NvmlSampler`
records why it is idle. ``pynvml.NVMLError`` never leaves this module; a wrong GPU index is the
caller's configuration error and raises :class:`~tuner.errors.ConfigError`.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import ModuleType
from typing import Any

import pandas as pd

from tuner.errors import ConfigError
from tuner.telemetry._base import PeriodicSampler, Window, in_window, trapezoid

COLUMNS = ["t", "gpu", "util_pct", "mem_used_mib", "power_w", "sm_clock_mhz", "energy_mj"]
_MIB = 1024 * 1024


class _NvmlUnavailable(Exception):
    """NVML cannot be used here (no library, no driver, no GPU); never leaves this module."""


# A module to use in place of pynvml: a simulated GPU host's devices (tuner.simulation.fake_nvml),
# named by the server backend's host set-up; the rest of this module cannot tell the difference.
NVML_MODULE_ENV = "TUNER_NVML_MODULE"


def _pynvml() -> ModuleType:
    name = os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise _NvmlUnavailable(f"{name} cannot be imported (nvidia-ml-py installed?)") from exc


@contextmanager
def _nvml() -> Iterator[ModuleType]:
    """An initialised NVML for the block; any NVMLError in it becomes :class:`_NvmlUnavailable`.

    NVML ref-counts init/shutdown, so this nests with a running :class:`NvmlSampler`.
    """
    nv = _pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise _NvmlUnavailable(f"NVML init failed: {exc}") from exc
    try:
        yield nv
    except nv.NVMLError as exc:
        raise _NvmlUnavailable(f"NVML call failed: {exc}") from exc
    finally:
        _shutdown(nv)


def _shutdown(nv: ModuleType) -> None:
    # Nothing useful to do if the driver went away meanwhile.
    with suppress(nv.NVMLError):
        nv.nvmlShutdown()


def _text(value: bytes | str) -> str:
    # Older nvidia-ml-py returns bytes, newer returns str.
    return value.decode() if isinstance(value, bytes) else value


def gpu_count() -> int:
    """Number of GPUs NVML sees; 0 when NVML is absent or fails."""
    try:
        with _nvml() as nv:
            return int(nv.nvmlDeviceGetCount())
    except _NvmlUnavailable:
        return 0


def gpu_inventory() -> list[dict[str, Any]]:
    """One dict per GPU: index, name, memory_total_mib, driver. Empty without NVML."""
    try:
        with _nvml() as nv:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            return [_describe(nv, i, driver) for i in range(nv.nvmlDeviceGetCount())]
    except _NvmlUnavailable:
        return []


def visible_entries(visible: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as its entries (``"0,2"`` -> ["0", "2"]); None when unset."""
    if visible is None:
        return None
    return [e.strip() for e in visible.split(",") if e.strip()]


def visible_uuids(visible: str | None) -> list[str] | None:
    """The UUIDs of the GPUs a process with ``CUDA_VISIBLE_DEVICES=visible`` sees, in its order.

    An entry is a UUID (``GPU-...``, ``MIG-...``) or an index in NVML's (PCI bus) order, which
    is CUDA's when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the trial sets it). None: every GPU (the
    variable is unset); [] without NVML, or when it names no GPU. A name NVML does not know
    is a ConfigError: the server would run on other GPUs than the ones sampled.
    """
    entries = visible_entries(visible)
    if entries is None:
        return None
    try:
        with _nvml() as nv:
            return [_uuid(nv, _handle(nv, entry)) for entry in entries]
    except _NvmlUnavailable:
        return []


def _handle(nv: ModuleType, entry: str) -> Any:
    """The NVML handle of one CUDA_VISIBLE_DEVICES entry (an index or a UUID)."""
    if entry.isdigit():
        count = int(nv.nvmlDeviceGetCount())
        if int(entry) >= count:
            raise ConfigError(
                f"GPU {entry} does not exist: NVML sees {count} GPU(s)",
                hint="check server.cuda_visible_devices",
            )
        return nv.nvmlDeviceGetHandleByIndex(int(entry))
    try:
        return nv.nvmlDeviceGetHandleByUUID(entry)
    except nv.NVMLError:
        raise ConfigError(
            f"no GPU has the UUID {entry!r}", hint="check server.cuda_visible_devices"
        ) from None


def _uuid(nv: ModuleType, handle: Any) -> str:
    return _text(nv.nvmlDeviceGetUUID(handle))


def _uuid_or_blank(nv: ModuleType, handle: Any) -> str:
    """A GPU's UUID for the record; "" where this driver cannot tell it."""
    try:
        return _uuid(nv, handle)
    except (nv.NVMLError, AttributeError):
        return ""


def _describe(nv: ModuleType, index: int, driver: str) -> dict[str, Any]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    return {
        "index": index,
        "name": _text(nv.nvmlDeviceGetName(handle)),
        "memory_total_mib": nv.nvmlDeviceGetMemoryInfo(handle).total / _MIB,
        "driver": driver,
    }


class NvmlSampler(PeriodicSampler):
    """Samples utilisation, memory, power, SM clock and the energy counter of each GPU.

    ``devices`` (a server's ``CUDA_VISIBLE_DEVICES`` entries: UUIDs, or indices in PCI order)
    wins over ``indices``; neither samples every GPU NVML sees. A trial samples only its
    server's GPUs, opened by UUID: an idle GPU beside it would add its idle power to the
    trial's energy and dilute its utilisation.
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        indices: list[int] | None = None,
        devices: list[str] | None = None,
    ) -> None:
        super().__init__(interval_s, "nvml")
        self.indices = indices
        self.devices = devices
        self._nv: ModuleType | None = None
        self._handles: dict[int, Any] = {}
        self.sampled: list[str] = []  # the UUIDs of the GPUs sampled, in index order
        self._rows: list[dict[str, float]] = []

    @property
    def available(self) -> bool:
        """Whether sampling actually runs (NVML initialised and GPUs found)."""
        return bool(self._handles)

    def _setup(self) -> bool:
        try:
            nv = _pynvml()
        except _NvmlUnavailable as exc:
            self._note(str(exc))
            return False
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self._note(f"NVML init failed: {exc}")
            return False
        self._nv, self._handles = nv, {}
        try:
            self._handles = self._open_handles(nv)
        except nv.NVMLError as exc:
            self._note(f"cannot open GPU handles: {exc}")
        finally:
            if not self._handles:  # also on ConfigError: shut NVML down before it propagates
                self._teardown()
        return bool(self._handles)

    def _open_handles(self, nv: ModuleType) -> dict[int, Any]:
        if self.devices is not None:
            return self._by_device(nv, self.devices)
        count = int(nv.nvmlDeviceGetCount())
        indices = list(range(count)) if self.indices is None else list(self.indices)
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            raise ConfigError(
                f"GPU indices {bad} do not exist: NVML sees {count} GPU(s)",
                hint="check server.cuda_visible_devices",
            )
        handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in indices}
        self.sampled = [_uuid_or_blank(nv, h) for h in handles.values()]
        return handles

    def _by_device(self, nv: ModuleType, devices: list[str]) -> dict[int, Any]:
        """Handles keyed by NVML index (the summary's ``gpu<i>_`` keys); their UUIDs recorded."""
        handles = {}
        for device in devices:
            handle = _handle(nv, device)
            handles[int(nv.nvmlDeviceGetIndex(handle))] = handle
        self.sampled = [_uuid(nv, handles[i]) for i in sorted(handles)]
        return dict(sorted(handles.items()))

    def _teardown(self) -> None:
        if self._nv is not None:
            _shutdown(self._nv)
        self._nv = None

    def _sample(self) -> None:
        nv = self._nv
        if nv is None:
            return
        now = time.time()
        rows = [self._read(nv, index, handle, now) for index, handle in self._handles.items()]
        with self._lock:
            self._rows.extend(rows)

    def _read(self, nv: ModuleType, index: int, handle: Any, now: float) -> dict[str, float]:
        readers: dict[str, Callable[[], float]] = {
            "util_pct": lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu,
            "mem_used_mib": lambda: nv.nvmlDeviceGetMemoryInfo(handle).used / _MIB,
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
            # Cumulative mJ since the driver loaded (Volta+): a cross-check of integrated power.
            "energy_mj": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
        }
        row = {"t": now, "gpu": float(index)}
        row.update({column: self._field(nv, column, read) for column, read in readers.items()})
        return row

    def _field(self, nv: ModuleType, what: str, read: Callable[[], float]) -> float:
        """One NVML reading; NaN when this GPU does not support it (e.g. power on some boards)."""
        try:
            return float(read())
        except nv.NVMLError as exc:
            self._note(f"cannot read {what}: {exc}")
            return float("nan")

    @property
    def samples(self) -> pd.DataFrame:
        """All samples: columns t, gpu, util_pct, mem_used_mib, power_w, sm_clock_mhz, energy_mj."""
        with self._lock:
            rows = list(self._rows)
        frame = pd.DataFrame(rows, columns=COLUMNS)
        frame["gpu"] = frame["gpu"].astype(int)
        return frame

    def summary(self, window: Window | None = None) -> dict[str, float]:
        """Totals over GPUs and per-GPU figures (prefix ``gpu<i>_``); empty without samples."""
        frame = in_window(self.samples, window)
        if frame.empty:
            return {}
        per_gpu = {int(i): _gpu_summary(g) for i, g in frame.groupby("gpu")}
        out: dict[str, float] = {
            "gpus": float(len(per_gpu)),
            "util_mean_pct": float(frame["util_pct"].mean()),
            "util_max_pct": float(frame["util_pct"].max()),
            "mem_used_max_mib": float(frame["mem_used_mib"].max()),
            "power_mean_w": sum(s["power_mean_w"] for s in per_gpu.values()),
            "energy_j": sum(s["energy_j"] for s in per_gpu.values()),
        }
        counters = [s["energy_counter_j"] for s in per_gpu.values() if "energy_counter_j" in s]
        if len(counters) == len(per_gpu):
            out["energy_counter_j"] = sum(counters)
        for index, stats in per_gpu.items():
            out.update({f"gpu{index}_{k}": v for k, v in stats.items()})
        return {k: v for k, v in out.items() if not math.isnan(v)}  # unsupported readings


def _gpu_summary(frame: pd.DataFrame) -> dict[str, float]:
    frame = frame.sort_values("t")
    out = {
        "util_mean_pct": float(frame["util_pct"].mean()),
        "util_max_pct": float(frame["util_pct"].max()),
        "mem_used_max_mib": float(frame["mem_used_mib"].max()),
        "power_mean_w": float(frame["power_w"].mean()),
        "power_max_w": float(frame["power_w"].max()),
        # NaN, not 0, when power is unreadable: a total must not look complete when it is not.
        "energy_j": (
            trapezoid(frame["power_w"], frame["t"])
            if frame["power_w"].notna().sum() >= 2
            else math.nan
        ),
    }
    energy = frame["energy_mj"].dropna()
    if len(energy) >= 2:
        out["energy_counter_j"] = float(energy.iloc[-1] - energy.iloc[0]) / 1000.0
    return out
