"""How often does `tuner check` cry wolf, and how small a regression does it catch?

The evidence is a real study's export: a baseline-only `tuner run` of a deployment command
(``--baseline`` windows, each its own launch, so the study's noise is known), pinned to one CPU
with the load generator on another. Then, for each ``max_num_seqs`` of ``--levels`` (the first
is the deployed value, unchanged), a real vLLM-CPU server of that config is started on the same
CPU and the real `tuner check` CLI runs ``--checks`` times against it (each check ``--windows``
windows, its own default 3), with the client on the study's client CPU. Reported per level:
the deployment's throughput against the evidence (measured, not set), and how many checks
said *regression*. The first level's rate is the false-alarm rate; the smallest measured
regression caught in at least 9 of 10 checks is the detection figure:

    .venv/bin/python -m benchmarks.check_power        # → results/check_power/<machine>/

Extra arguments are Hydra overrides for the study (the workload every check then replays).

``--fake`` asks the question per objective, in minutes: what does the check catch of a
regression of known size? A streaming fake (tuner.testing.sse_server) serves the evidence's
windows, then is slowed by a known amount (benchmarks/check_power_fake.py says how) and the
real `tuner check` runs ``--checks`` times against each setting:

    .venv/bin/python -m benchmarks.check_power --fake  # → results/check_power/<machine>/fake/
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.layout import ROOT, machine, results
from tuner import LaunchSpec, compose, make_backend, resolve

MODEL = ROOT / "models" / "tiny-llama"
# The quickstart's CPU deployment with room for all of its 16 users; lower max_num_seqs make
# the regressions (users wait in vLLM's queue).
DEPLOYED = (
    "VLLM_CPU_KVCACHE_SPACE=1 vllm serve {model} --max-model-len 2048 --enforce-eager "
    "--distributed-executor-backend uni --max-num-seqs {seqs}"
)
WORKLOAD = ["quality.enabled=false", "workload.warmup_s=3", "workload.window_s=8"]
# The study, every deployment and every check: the server on one CPU, the client on another.
SERVER_CPU, CLIENT_CPU = sorted(os.sched_getaffinity(0))[:2]


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], cwd=ROOT, capture_output=True, text=True
    )


def study(tmp: Path, seqs: int, baseline: int, overrides: Sequence[str]) -> Path:
    """The evidence.json of a study of the deployed command that measures only its baseline:
    its one stage's only point is the deployed value, which the seeded incumbent covers."""
    command = DEPLOYED.format(model=MODEL, seqs=seqs)
    run = tuner(
        "run",
        "name=check_power",
        f"studies_dir={tmp}",
        "study.stages=[batching]",
        "search_space=[batching_coarse]",
        f"search_space.batching.max_num_seqs.choices=[{seqs}]",
        f"study.baseline_measurements={baseline}",
        f"server.from_command={command}",
        f"placement.server_cpus={SERVER_CPU}",
        f"placement.client_cpus={CLIENT_CPU}",
        *WORKLOAD,
        *overrides,
    )
    export = tuner("export", "check_power", "--studies-dir", str(tmp), "--format", "cli")
    for proc in (run, export):
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    return tmp / "check_power" / "export" / "evidence.json"


def level(tmp: Path, evidence: Path, seqs: int, args: argparse.Namespace) -> dict[str, Any]:
    """One deployment of ``max_num_seqs=seqs`` and ``--checks`` checks of it."""
    config = compose(
        [f"server.from_command={DEPLOYED.format(model=MODEL, seqs=seqs)}", "server.api_key="]
    )
    log = tmp / f"s{seqs}" / "server.log"
    launch = resolve(LaunchSpec(cpus=[SERVER_CPU]), config.server)
    server = make_backend(config.server, launch, log)
    checks = []
    with server:
        server.wait_ready(time.monotonic() + 600)
        for i in range(args.checks):
            out = tmp / f"s{seqs}" / f"check{i}"
            proc = tuner(
                "check",
                "--url",
                server.base_url,
                "--evidence",
                str(evidence),
                "--out",
                str(out),
                "--windows",
                str(args.windows),
                "--client-cpus",
                str(CLIENT_CPU),
            )
            if proc.returncode not in (0, 1):
                raise SystemExit(proc.stderr[-2000:])
            report = json.loads((out / "check.json").read_text())
            checks.append(_check_row(report, proc.returncode))
            print(json.dumps({"max_num_seqs": seqs, **checks[-1]}), flush=True)
    return {"max_num_seqs": seqs, "checks": checks, **_summary(checks)}


def _check_row(report: dict[str, Any], rc: int) -> dict[str, Any]:
    rows = {r["name"]: r for r in report["rows"]}
    tput = rows["output_throughput"]
    return {
        "exit": rc,
        "throughput_change": tput["change"],
        "throughput_allowed": tput["allowed"],
        "verdicts": {name: r["verdict"] for name, r in rows.items()},
        "loadavg_1m": round(os.getloadavg()[0], 2),  # other work on the host shows here
    }


def _summary(checks: list[dict[str, Any]]) -> dict[str, Any]:
    changes = [c["throughput_change"] for c in checks if c["throughput_change"] is not None]
    return {
        "flagged": sum(c["exit"] == 1 for c in checks),
        "throughput_flagged": sum(
            c["verdicts"].get("output_throughput") == "regression" for c in checks
        ),
        "throughput_change_mean": float(np.mean(changes)) if changes else None,
        "allowed_mean": float(np.mean([c["throughput_allowed"] or 0 for c in checks])),
    }


def findings(levels: list[dict[str, Any]], checks: int) -> dict[str, Any]:
    unchanged, rest = levels[0], levels[1:]
    caught = [lv for lv in rest if lv["flagged"] >= 0.9 * checks]
    smallest = min(caught, key=lambda lv: -lv["throughput_change_mean"], default=None)
    return {
        "false_alarm_rate": unchanged["flagged"] / checks,
        "smallest_caught_9_of_10": None
        if smallest is None
        else {
            "max_num_seqs": smallest["max_num_seqs"],
            "throughput_change": smallest["throughput_change_mean"],
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| max_num_seqs | throughput vs evidence | allowed drop | checks failed | on throughput |",
        "|---|---|---|---|---|",
    ]
    for lv in result["levels"]:
        lines.append(
            f"| {lv['max_num_seqs']} | {lv['throughput_change_mean']:+.1%} | "
            f"{lv['allowed_mean']:.1%} | {lv['flagged']}/{len(lv['checks'])} | "
            f"{lv['throughput_flagged']}/{len(lv['checks'])} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--levels", default="16,12,8,4", help="max_num_seqs; the first is deployed")
    ap.add_argument("--checks", type=int, default=10, help="checks per level")
    ap.add_argument("--windows", type=int, default=3, help="windows per check")
    ap.add_argument("--baseline", type=int, default=3, help="the study's baseline windows")
    ap.add_argument("--out", type=Path, default=None, help="default: results/check_power/<m>")
    ap.add_argument("--fake", action="store_true", help="regressions of known size, a fake server")
    ap.add_argument("--max-windows", type=int, default=12, help="each check's budget (--fake)")
    ap.add_argument("--min-gain", type=float, default=0.02, help="the evidence's (--fake)")
    ap.add_argument("--warmup-s", type=float, default=1.0, help="each window's (--fake)")
    ap.add_argument("--window-s", type=float, default=2.0, help="each window (--fake)")
    ap.add_argument("--drift-sd", type=float, default=0.05, help="the fake host's (--fake)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.fake:
        from benchmarks.check_power_fake import run

        return run(args)
    seqs = [int(s) for s in args.levels.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="check-power-") as name:
        tmp = Path(name)
        evidence = study(tmp, seqs[0], args.baseline, args.overrides)
        reference = json.loads(evidence.read_text())["check"]
        levels = [level(tmp, evidence, s, args) for s in seqs]
    result = {
        "levels": levels,
        "findings": findings(levels, args.checks),
        "evidence": {k: reference[k] for k in ("samples", "noise", "min_gain")},
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine(),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    out = args.out or results("check_power", machine())
    out.mkdir(parents=True, exist_ok=True)
    (out / "check_power.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "check_power.md").write_text(table(result) + "\n")
    print(table(result))
    print(json.dumps(result["findings"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
