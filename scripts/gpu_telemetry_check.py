#!/usr/bin/env python3
"""Check tuner's NVML telemetry against a really busy GPU (run on a GPU machine; ~30 s).

Phases: idle (baseline) -> busy (a compute loop plus a memory ballast) -> cool-down, sampled by
:class:`tuner.telemetry.nvml.NvmlSampler`. It then asserts that, while busy, utilisation was above
50 %, power rose above idle, memory used grew by most of the ballast, and the integrated power
agrees with NVML's own energy counter. The load comes from the first that works of: torch
(bf16 matmuls), cupy (fp32 matmuls), or the CUDA driver itself through ctypes (a JIT-compiled PTX
FMA loop), so it runs with only numpy, pandas, nvidia-ml-py, psutil and this repository.

Prints a JSON summary to stdout and writes it (and the raw samples) to ``$OUT`` or ``--out``.
Exit status: 0 all checks passed, 1 a check failed, 2 nothing to check (no GPU or no load).

    python scripts/gpu_telemetry_check.py [--busy-s 20] [--gpu 0]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

# Runnable from a bare checkout: put the repository root (holding tuner/) on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.telemetry.nvml import NvmlSampler, gpu_inventory

MIB = 1024 * 1024
STEP_S = 0.1  # one unit of load work; short so the busy phase ends on time

# Four independent FMA chains per thread keep the SMs issuing; the result is stored so the JIT
# cannot drop the loop. Compiled by the driver for whatever GPU is present.
SPIN_PTX = r"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 spin_out, .param .u32 spin_iters)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<8>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [spin_out];
    ld.param.u32 %r1, [spin_iters];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    cvt.rn.f32.u32 %f1, %r5;
    mov.f32 %f2, %f1;
    mov.f32 %f3, %f1;
    mov.f32 %f4, %f1;
    mov.u32 %r6, 0;
LOOP:
    fma.rn.f32 %f1, %f1, 0f3F7FFFEF, 0f3A83126F;
    fma.rn.f32 %f2, %f2, 0f3F7FFFEF, 0f3A83126F;
    fma.rn.f32 %f3, %f3, 0f3F7FFFEF, 0f3A83126F;
    fma.rn.f32 %f4, %f4, 0f3F7FFFEF, 0f3A83126F;
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
    add.f32 %f5, %f1, %f2;
    add.f32 %f6, %f3, %f4;
    add.f32 %f7, %f5, %f6;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f7;
    ret;
}
"""


class Load(Protocol):
    name: str

    def step(self) -> None:
        """About STEP_S seconds of GPU work, synchronously."""

    def close(self) -> None:
        """Free the GPU memory and context."""


class TorchLoad:
    name = "torch"

    def __init__(self, gpu: int, ballast_mib: int) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA")
        self.torch = torch
        self.device = torch.device(f"cuda:{gpu}")
        self.ballast = torch.ones(ballast_mib * MIB, dtype=torch.uint8, device=self.device)
        self.a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=self.device)
        self.b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=self.device)

    def step(self) -> None:
        end = time.monotonic() + STEP_S
        while time.monotonic() < end:
            for _ in range(8):
                _ = self.a @ self.b  # the work is the point
            self.torch.cuda.synchronize(self.device)

    def close(self) -> None:
        del self.ballast, self.a, self.b
        self.torch.cuda.empty_cache()


class CupyLoad:
    name = "cupy"

    def __init__(self, gpu: int, ballast_mib: int) -> None:
        import cupy

        self.cp = cupy
        cupy.cuda.Device(gpu).use()
        self.ballast = cupy.ones(ballast_mib * MIB, dtype=cupy.uint8)
        self.a = cupy.random.random((4096, 4096), dtype=cupy.float32)
        self.b = cupy.random.random((4096, 4096), dtype=cupy.float32)

    def step(self) -> None:
        end = time.monotonic() + STEP_S
        while time.monotonic() < end:
            for _ in range(4):
                _ = self.a @ self.b  # the work is the point
            self.cp.cuda.Device().synchronize()

    def close(self) -> None:
        del self.ballast, self.a, self.b
        self.cp.get_default_memory_pool().free_all_blocks()


class DriverLoad:
    """The CUDA driver API through ctypes: needs only libcuda, which NVML's driver ships."""

    name = "cuda-driver"
    THREADS = 256

    def __init__(self, gpu: int, ballast_mib: int) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._declare()
        self._check(self.cu.cuInit(0), "cuInit")
        self.dev = ctypes.c_int()
        self._check(self.cu.cuDeviceGet(ctypes.byref(self.dev), gpu), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "ctx")
        self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.blocks = 8 * self._attribute(16)  # 16 = CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        self.ballast = self._alloc(ballast_mib * MIB)
        self.out = self._alloc(self.blocks * self.THREADS * 4)
        self.fn = self._load_kernel()
        self.iters = self._calibrate()

    def _declare(self) -> None:
        cu, vp, u = self.cu, ctypes.c_void_p, ctypes.c_uint
        cu.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), vp]
        cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        cu.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
        cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        cu.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        cu.cuCtxSetCurrent.argtypes = [vp]

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.cu.cuGetErrorName(result, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: CUDA error {result} {name.value!r}")

    def _attribute(self, attribute: int) -> int:
        value = ctypes.c_int()
        self._check(self.cu.cuDeviceGetAttribute(ctypes.byref(value), attribute, self.dev), "attr")
        return value.value

    def _alloc(self, nbytes: int) -> ctypes.c_uint64:
        ptr = ctypes.c_uint64()
        self._check(self.cu.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc")
        self._check(self.cu.cuMemsetD8_v2(ptr, 1, nbytes), "cuMemset")  # make it resident
        return ptr

    def _load_kernel(self) -> ctypes.c_void_p:
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.cu.cuModuleLoadData(ctypes.byref(module), SPIN_PTX.encode()), "PTX JIT")
        self._check(self.cu.cuModuleGetFunction(ctypes.byref(fn), module, b"spin"), "function")
        return fn

    def _launch(self, iters: int) -> None:
        out, count = ctypes.c_uint64(self.out.value), ctypes.c_uint32(iters)
        args = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
            ctypes.cast(ctypes.byref(count), ctypes.c_void_p),
        )
        launch = self.cu.cuLaunchKernel(
            self.fn, self.blocks, 1, 1, self.THREADS, 1, 1, 0, None, args, None
        )
        self._check(launch, "cuLaunchKernel")
        self._check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def _calibrate(self) -> int:
        """Grow the loop count until one launch takes about STEP_S."""
        iters = 1 << 12
        while iters < (1 << 30):
            start = time.monotonic()
            self._launch(iters)
            if time.monotonic() - start >= STEP_S / 2:
                break
            iters *= 2
        return iters

    def step(self) -> None:
        self._launch(self.iters)

    def close(self) -> None:
        self.cu.cuMemFree_v2(self.ballast)
        self.cu.cuMemFree_v2(self.out)
        self.cu.cuDevicePrimaryCtxRelease(self.dev)


def make_load(gpu: int, ballast_mib: int, errors: dict[str, str]) -> Load | None:
    """The first load backend that starts; why the others did not goes into ``errors``."""
    factories: list[tuple[str, Callable[[int, int], Load]]] = [
        ("torch", TorchLoad),
        ("cupy", CupyLoad),
        ("cuda-driver", DriverLoad),
    ]
    for name, factory in factories:
        try:
            return factory(gpu, ballast_mib)
        except Exception as exc:  # why: any backend may be missing or broken; try the next
            errors[name] = f"{type(exc).__name__}: {exc}"
    return None


def run_phases(args: argparse.Namespace, sampler: NvmlSampler, report: dict[str, Any]) -> None:
    """idle -> busy -> cool-down; the phase windows go into ``report``."""
    t0 = time.time()
    time.sleep(args.idle_s)
    report["windows"] = {"idle": (t0, time.time())}
    errors: dict[str, str] = {}
    load = make_load(args.gpu, args.ballast_mib, errors)
    report["load"], report["load_errors"] = (load.name if load else None), errors
    if load is None:
        return
    try:
        load.step()  # the first step pays for start-up; the busy window starts after it
        busy_start = time.time()
        while time.time() - busy_start < args.busy_s:
            load.step()
        report["windows"]["busy"] = (busy_start, time.time())
    finally:
        load.close()
    time.sleep(args.cooldown_s)


def checks(idle: dict[str, float], busy: dict[str, float], ballast_mib: int) -> dict[str, Any]:
    def check(ok: bool, detail: str) -> dict[str, Any]:
        return {"ok": bool(ok), "detail": detail}

    util = busy.get("util_mean_pct", 0.0)
    p_idle, p_busy = idle.get("power_mean_w", 0.0), busy.get("power_mean_w", 0.0)
    m_idle, m_busy = idle.get("mem_used_max_mib", 0.0), busy.get("mem_used_max_mib", 0.0)
    out = {
        "utilization": check(util > 50.0, f"busy mean {util:.1f} % (> 50 %)"),
        "power": check(p_busy > 1.1 * p_idle, f"idle {p_idle:.1f} W -> busy {p_busy:.1f} W"),
        "memory": check(
            m_busy - m_idle >= 0.9 * ballast_mib,
            f"idle {m_idle:.0f} MiB -> busy {m_busy:.0f} MiB (ballast {ballast_mib} MiB)",
        ),
    }
    if "energy_counter_j" in busy and busy["energy_counter_j"] > 0:
        ratio = busy.get("energy_j", 0.0) / busy["energy_counter_j"]
        out["energy"] = check(
            0.8 <= ratio <= 1.2,
            f"integrated {busy.get('energy_j', 0):.0f} J vs counter "
            f"{busy['energy_counter_j']:.0f} J (ratio {ratio:.2f}, 0.8..1.2)",
        )
    return out


def write_outputs(report: dict[str, Any], sampler: NvmlSampler, out_dir: str | None) -> None:
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if out_dir:
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "gpu_telemetry_check.json").write_text(text + "\n")
        sampler.samples.to_csv(path / "gpu_telemetry_samples.csv", index=False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML/CUDA index of the GPU to load")
    parser.add_argument("--busy-s", type=float, default=20.0)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--cooldown-s", type=float, default=2.0)
    parser.add_argument("--interval-s", type=float, default=0.25)
    parser.add_argument("--ballast-mib", type=int, default=4096)
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for JSON + CSV")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # CUDA's default order (fastest first) may differ from NVML's PCI order; make them agree.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    inventory = gpu_inventory()
    report: dict[str, Any] = {"ok": False, "inventory": inventory}
    if not any(g["index"] == args.gpu for g in inventory):
        report["reason"] = f"NVML sees no GPU {args.gpu} (inventory: {len(inventory)} GPUs)"
        print(json.dumps(report, indent=2))
        return 2
    sampler = NvmlSampler(args.interval_s, [args.gpu])
    sampler.start()
    try:
        run_phases(args, sampler, report)
    finally:
        sampler.stop()
    windows = report["windows"]
    summaries = {phase: sampler.summary(window) for phase, window in windows.items()}
    report.update(summaries=summaries, samples=len(sampler.samples), warnings=sampler.warnings)
    if "busy" not in summaries:
        report["reason"] = "no load backend started: nothing to check"
        write_outputs(report, sampler, args.out)
        return 2
    report["checks"] = checks(summaries["idle"], summaries["busy"], args.ballast_mib)
    report["ok"] = all(c["ok"] for c in report["checks"].values())
    write_outputs(report, sampler, args.out)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
