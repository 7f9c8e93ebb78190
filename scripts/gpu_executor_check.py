#!/usr/bin/env python3
"""Check the Ray executor's GPU assignment on real GPUs (run on a GPU machine; ~1 minute).

A local Ray instance with the host's real GPUs runs trials of tensor-parallel sizes that fill
them (on 8 GPUs: 1, 1, 2, 4 side by side, then 8; on one GPU: 1 and 1, one after the other)
through tuner's own executor (:mod:`tuner.executor`: placement groups, Ray's
``CUDA_VISIBLE_DEVICES``, the node's cores). Each trial, instead of a vLLM server, starts a GPU
load on every GPU it was given (the CUDA driver through ctypes, or torch/cupy: see
scripts/gpu_telemetry_check.py) while tuner's telemetry samples its GPUs. It then asserts, per
trial: the server's ``CUDA_VISIBLE_DEVICES`` is Ray's assignment; CUDA (asked by the load
itself, ``cuDeviceGetUuid``) sees exactly the GPUs NVML sampled, by UUID; the sampled GPUs were
busy; and trials that overlapped in time had disjoint GPUs.

Prints a JSON report and writes it to ``$OUT`` or ``--out``. Exit status: 0 all checks passed,
1 a check failed, 2 nothing to check (no GPU, no Ray).

    python scripts/gpu_executor_check.py [--busy-s 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a bare checkout

from tuner.config import TunerConfig  # noqa: E402
from tuner.executor import Demand, JobResult, TrialJob, make_executor  # noqa: E402
from tuner.executor.cluster import loopback_only  # noqa: E402
from tuner.schema import TrialStatus  # noqa: E402
from tuner.search.launch import LaunchSpec  # noqa: E402
from tuner.search.resolved import ResolvedLaunch, resolve  # noqa: E402
from tuner.telemetry import Telemetry  # noqa: E402
from tuner.telemetry.nvml import gpu_inventory, visible_entries, visible_uuids  # noqa: E402
from tuner.trial.outcome import TrialOutcome  # noqa: E402
from tuner.trial.run import with_device_order  # noqa: E402

# One GPU process: "uuids" prints the UUIDs CUDA gives its visible devices, in CUDA's order;
# "load" keeps its device 0 busy for argv[3] seconds (gpu_telemetry_check's load backends).
CHILD = r"""
import ctypes, json, os, sys, time
mode = sys.argv[1]
if mode == "uuids":
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    count = ctypes.c_int()
    cu.cuDeviceGetCount(ctypes.byref(count))
    uuids = []
    for i in range(count.value):
        dev, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        cu.cuDeviceGet(ctypes.byref(dev), i)
        cu.cuDeviceGetUuid(raw, dev)
        h = bytes(raw).hex()
        uuids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    print(json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "uuids": uuids}))
else:
    sys.path.insert(0, sys.argv[2])
    from gpu_telemetry_check import make_load
    errors = {}
    load = make_load(0, 1024, errors)
    end = time.time() + float(sys.argv[3])
    while load is not None and time.time() < end:
        load.step()
    if load is not None:
        load.close()
    print(json.dumps({"load": load.name if load else None, "errors": errors}))
"""


def _child(mode: str, visible: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    argv = [sys.executable, "-c", CHILD, mode, str(ROOT / "scripts"), *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def gpu_trial(
    config: TunerConfig,
    launch: ResolvedLaunch,
    paths: Any,
    trial_id: str,
    progress: Any = None,
    busy_s: float = 8.0,
) -> TrialOutcome:
    """A trial whose 'server' is a GPU load on each GPU it was given, under tuner's telemetry."""
    config = with_device_order(config)
    visible = config.server.cuda_visible_devices or ""
    seen = json.loads(_child("uuids", visible).communicate(timeout=60)[0])
    config.telemetry.interval_s = 0.25
    telemetry = Telemetry(config.telemetry, gpu_devices=visible_entries(visible))
    with telemetry:
        loads = [_child("load", entry, str(busy_s)) for entry in visible_entries(visible) or []]
        start = time.time() + 2.0  # past the loads' start-up
        ran = [json.loads(p.communicate(timeout=busy_s + 120)[0]) for p in loads]
        end = time.time() - 0.5
    outcome = TrialOutcome(trial_id, TrialStatus.OK, ["gpu-load"], launch.record())
    outcome.telemetry = telemetry.summary((start, end))
    outcome.message = json.dumps({"cuda_saw": seen, "loads": ran})
    return outcome


def waves(gpus: int) -> list[list[int]]:
    """TP sizes that fill the GPUs side by side, then one trial of all of them."""
    sizes, size = [1], 1
    while sum(sizes) + size * 2 <= gpus:
        size *= 2
        sizes.append(size)
    if sum(sizes) < gpus:
        sizes.insert(0, 1)
    return [sizes, [gpus if gpus & (gpus - 1) == 0 else max(sizes)]]


def run(gpus: int, busy_s: float) -> list[JobResult]:
    import functools

    config = TunerConfig()
    config.server.device, config.study.executor = "cuda", "ray"
    config.study.parallel, config.ray.cpus_per_trial = "auto", 1
    trial_fn = functools.partial(gpu_trial, busy_s=busy_s)
    executor = make_executor(config, trial_fn, lambda line: print(line, file=sys.stderr))
    results: list[JobResult] = []
    try:
        for n, tp in enumerate(t for wave in waves(gpus) for t in wave):
            launch = resolve(LaunchSpec(args={"tensor_parallel_size": tp}), config.server)
            folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu-executor-check/tp{tp}-{n}"
            job = TrialJob(
                f"check#{n}",
                f"tp{tp}-{n}",
                config,
                launch,
                folder,
                f"[tp {tp} #{n}]",
                Demand(tp, 1),
            )
            executor.submit(job)
        while executor.in_flight:
            results.append(executor.wait())
    finally:
        executor.close()
    return results


def check(result: JobResult) -> dict[str, Any]:
    d, o = result.devices, result.outcome
    detail = json.loads(o.message or "{}")
    saw = detail.get("cuda_saw", {})
    expected = visible_uuids(d.cuda_visible_devices) or []
    util = o.telemetry.gpu.get("util_mean_pct", 0.0)
    return {
        "trial": o.trial_id,
        "cuda_visible_devices": d.cuda_visible_devices,
        "ray_gpu_ids": d.gpu_ids,
        "sampled": d.gpus_sampled,
        "cuda_saw": saw.get("uuids"),
        "util_mean_pct": round(util, 1),
        "loads": detail.get("loads"),
        "ok_assignment": d.cuda_visible_devices == ",".join(d.gpu_ids) == saw.get("visible"),
        "ok_uuids": bool(expected) and saw.get("uuids") == expected == d.gpus_sampled,
        "ok_busy": util > 30.0,
        "span": (d.started_at, d.ended_at),
        "gpus": set(d.gpu_ids),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--busy-s", type=float, default=8.0)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the JSON report")
    args = ap.parse_args(argv)
    gpus = len(gpu_inventory())
    report: dict[str, Any] = {"ok": False, "gpus": gpus}
    try:
        loopback_only()
        import ray
    except ImportError:
        report["reason"] = "Ray is not installed (pip install 'tuner[ray]')"
    if gpus == 0 or "reason" in report:
        report.setdefault("reason", "NVML sees no GPU")
        print(json.dumps(report, indent=2))
        return 2
    ray.init(num_cpus=max(4, gpus + 2), include_dashboard=False, log_to_driver=False)
    try:
        checks = [check(r) for r in run(gpus, args.busy_s)]
    finally:
        ray.shutdown()
    overlaps = [
        (a, b)
        for a, b in itertools.combinations(checks, 2)
        if a["span"][0] < b["span"][1] and b["span"][0] < a["span"][1]
    ]
    report["side_by_side"] = len(overlaps)
    report["ok_disjoint"] = all(a["gpus"].isdisjoint(b["gpus"]) for a, b in overlaps)
    report["ok_side_by_side"] = gpus < 2 or bool(overlaps)
    report["trials"] = [{k: v for k, v in c.items() if k not in ("span", "gpus")} for c in checks]
    keys = ("ok_assignment", "ok_uuids", "ok_busy")
    report["ok"] = (
        all(c[k] for c in checks for k in keys)
        and report["ok_disjoint"]
        and report["ok_side_by_side"]
    )
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_executor_check.json").write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
