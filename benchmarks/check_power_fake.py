"""What does `tuner check` catch on each objective? Regressions of known size on a fake server.

The evidence is ``--baseline`` windows of a streaming fake (tuner.testing.sse_server: 50 ms to
the first token, 10 ms a token, 8 users, every delay drifting by ``--drift-sd`` a second as a
busy host's do) measured as the check measures, its noise theirs. Then
the same server is slowed by 1+X and the real `tuner check` CLI runs ``--checks`` times against
each setting, ``--windows`` windows each, more within ``--max-windows``:

- *P99 E2E +X*: every 10th request takes 1+X times as long; the P99 is one of them, so it rises
  by X while the throughput hardly moves (a tail that stalls);
- *throughput, X slower*: every request takes 1+X times as long, so the closed loop serves
  1/(1+X) of the tokens (-17 %, -33 %, -50 % for X = 20 %, 50 %, 100 %);
- *unchanged*: every regression flagged is a false alarm.

A check detects a regression when that objective's row reads REGRESSION. Reported per setting
and objective: regressions, UNRESOLVED rows, the mean change measured and the mean resolution.
Called as ``python -m benchmarks.check_power --fake``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.layout import ROOT, machine, results
from tuner import (
    CheckEndpoint,
    LengthDist,
    NoiseEstimate,
    RequestClass,
    SloConfig,
    WorkloadConfig,
    measure_window,
    read_reference,
)
from tuner.testing.sse_server import FakeConfig, FakeServer

MODEL = ROOT / "models" / "tiny-llama"
P99, TPUT = "p99_e2e_latency", "output_throughput"
SIZES = (0.2, 0.5, 1.0)


def workload(args: argparse.Namespace) -> WorkloadConfig:
    def fixed(mean: int) -> LengthDist:
        return LengthDist(kind="fixed", mean=mean, std=0, low=1, high=1000)

    cls = RequestClass(
        name="short",
        weight=1.0,
        api="completions",
        prompt_tokens=fixed(64),
        output_tokens=fixed(16),
    )
    return WorkloadConfig(
        classes=[cls],
        mode="closed",
        concurrency=8,
        warmup_s=args.warmup_s,
        window_s=args.window_s,
        drain_timeout_s=5.0,
        seed=0,
    )


def unchanged(drift_sd: float) -> FakeConfig:
    """The fake as the evidence measures it: 50 ms to the first token, 10 ms a token, serving
    the model the evidence names, and, like vLLM, no keep-alive comments between tokens."""
    return FakeConfig(
        ttft_s=0.05, itl_s=0.01, model=str(MODEL), keepalive_comments=False, drift_sd=drift_sd
    )


def settings(drift_sd: float) -> list[tuple[str, str | None, float, FakeConfig]]:
    """(label, the objective regressed or None, X, the fake's behaviour that makes it)."""
    base = unchanged(drift_sd)
    out: list[tuple[str, str | None, float, FakeConfig]] = [("unchanged", None, 0.0, base)]
    out += [
        (f"P99 E2E +{x:.0%}", P99, x, replace(base, slow_every=10, slow_factor=1 + x))
        for x in SIZES
    ]
    out += [(f"throughput, {x:.0%} slower", TPUT, x, replace(base, factor=1 + x)) for x in SIZES]
    return out


def evidence(fake: FakeServer, tmp: Path, args: argparse.Namespace) -> Path:
    """evidence.json of ``--baseline`` windows of the unchanged fake, as `tuner export` writes."""
    wl, slo = workload(args), SloConfig(max_error_rate=0.01)
    check: dict[str, Any] = {
        "model": {"model": str(MODEL), "config_sha256": ""},
        "objectives": {P99: "minimize", TPUT: "maximize"},
        "constraints": ["error_rate"],
        "device": "cpu",
        "min_gain": args.min_gain,
    }
    path = tmp / "evidence.json"
    data = {
        "study": "check_power_fake",
        "choice": "the fake, unchanged",
        "slo": asdict(slo),
        "workload": asdict(wl),
        "check": check,
    }
    path.write_text(json.dumps(data))
    ref, endpoint = read_reference(path), CheckEndpoint(fake.url, None, str(MODEL))
    windows = [
        measure_window(endpoint, str(MODEL), ref.workload, ref.slo, tmp / f"evidence{i}")
        for i in range(args.baseline)
    ]
    values = [ref.scoring.values(m) for m in windows]
    check["samples"] = {n: [v[n] for v in values] for n in check["objectives"]}
    noise = {n: NoiseEstimate.of(s) for n, s in check["samples"].items()}
    check["noise"] = {n: {"rel_sd": e.rel_sd, "df": e.df} for n, e in noise.items()}
    path.write_text(json.dumps(data))
    return path


def one_check(url: str, path: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        "check",
        "--url",
        url,
        "--evidence",
        str(path),
        "--out",
        str(out),
        "--windows",
        str(args.windows),
        "--max-windows",
        str(args.max_windows),
    ]
    # the command a user runs, in its own process as a user runs it
    rc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", *argv], capture_output=True, check=False
    ).returncode
    report = json.loads((out / "check.json").read_text())
    rows = {r["name"]: r for r in report["rows"] if r["kind"] == "objective"}
    return {
        "exit": rc,
        "windows": report["windows"],
        "rows": {
            n: {k: r[k] for k in ("verdict", "change", "resolution")} for n, r in rows.items()
        },
        "loadavg_1m": round(os.getloadavg()[0], 2),  # other work on the host shows here
    }


def summary(label: str, target: str | None, x: float, checks: list[dict[str, Any]]) -> dict:
    def mean(name: str, key: str) -> float | None:
        got = [c["rows"][name][key] for c in checks if c["rows"][name][key] is not None]
        return float(np.mean(got)) if got else None

    per = {
        n: {
            "regression": sum(c["rows"][n]["verdict"] == "regression" for c in checks),
            "unresolved": sum(c["rows"][n]["verdict"] == "unresolved" for c in checks),
            "change_mean": mean(n, "change"),
            "resolution_mean": mean(n, "resolution"),
        }
        for n in (P99, TPUT)
    }
    return {
        "setting": label,
        "objective": target,
        "x": x,
        "checks": checks,
        "objectives": per,
        "windows_mean": float(np.mean([c["windows"] for c in checks])),
    }


def table(levels: list[dict[str, Any]], checks: int) -> str:
    lines = [
        "| injected | P99 E2E measured | P99 flagged | throughput measured | throughput flagged "
        "| unresolved (P99, tput) | windows a check |",
        "|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        p, t = lv["objectives"][P99], lv["objectives"][TPUT]
        lines.append(
            f"| {lv['setting']} | {p['change_mean']:+.1%} (±{p['resolution_mean']:.0%}) | "
            f"{p['regression']}/{checks} | {t['change_mean']:+.1%} (±{t['resolution_mean']:.0%}) "
            f"| {t['regression']}/{checks} | {p['unresolved']}, {t['unresolved']} | "
            f"{lv['windows_mean']:.1f} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    levels = []
    with (
        tempfile.TemporaryDirectory(prefix="check-power-fake-") as name,
        FakeServer(unchanged(args.drift_sd)) as fake,
    ):
        tmp = Path(name)
        path = evidence(fake, tmp, args)
        reference = json.loads(path.read_text())["check"]
        for label, target, x, config in settings(args.drift_sd):
            fake.reset(config)
            checks = []
            for i in range(args.checks):
                checks.append(one_check(fake.url, path, tmp / label / str(i), args))
                print(json.dumps({"setting": label, **checks[-1]}), flush=True)
            levels.append(summary(label, target, x, checks))
    result = {
        "levels": levels,
        "evidence": {k: reference[k] for k in ("samples", "noise", "min_gain")},
        "args": {k: str(v) for k, v in vars(args).items() if k != "out"},
        "machine": machine(),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    out = args.out or results("check_power", machine(), "fake")
    out.mkdir(parents=True, exist_ok=True)
    (out / "check_power.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "check_power.md").write_text(table(levels, args.checks) + "\n")
    print(table(levels, args.checks))
    return 0
