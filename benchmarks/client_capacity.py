"""How many SSE events per second does the client carry? Tuner's load generator (the trials'
Locust client, one and two processes side by side, interleaved in one run) against the probe's
fast local SSE server (tuner.loadgen.probe), at growing offered event rates.

Per run: the token events read per second, each sending process's CPU (of one core), the
events per CPU second (one process's capacity at a full core: what `tuner client-capacity`
stores), and the P99 TTFT and inter-token gap the client read against a server that sends a
token every ``--itl`` seconds (a client that keeps up reads gaps of about one tick).

    .venv/bin/python -m benchmarks.client_capacity --rounds 2
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.layout import machine, results
from tuner import ProbeRun, read_cpuinfo, run_probe


def _row(run: ProbeRun, users: int, round_: int) -> dict[str, Any]:
    row = asdict(run)
    row.update(
        users=users,
        round=round_,
        events_per_cpu_s=run.events_per_cpu_s,
        events_s_per_process=run.carried_events_s / run.processes,
        kept_up=run.carried_events_s >= 0.9 * run.offered_events_s,
    )
    return row


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the rounds, per (processes, users)."""
    keys = sorted({(r["processes"], r["users"]) for r in rows})
    out = []
    for processes, users in keys:
        group = [r for r in rows if r["processes"] == processes and r["users"] == users]

        def med(name: str, group: list[dict[str, Any]] = group) -> float:
            return statistics.median(float(r[name] or 0.0) for r in group)

        out.append(
            {
                "processes": processes,
                "users": users,
                "offered_events_s": med("offered_events_s"),
                "carried_events_s": med("carried_events_s"),
                "events_s_per_process": med("events_s_per_process"),
                "busiest_process_cores": statistics.median(max(r["cores"]) for r in group),
                "events_per_cpu_s": med("events_per_cpu_s"),
                "ttft_p99_ms": med("ttft_p99_s") * 1e3,
                "itl_p99_ms": med("itl_p99_s") * 1e3,
                "rounds": len(group),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--users", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--itl", type=float, default=0.004, help="the server's token tick, s")
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # a probe's plan reuses prompts: no server caches them
    out = args.out or results("client_capacity", machine())
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for round_ in range(args.rounds):
        for users in args.users:
            for processes in (1, 2):  # side by side: the same load, one after the other
                run = run_probe(processes, args.window, users, args.itl)
                rows.append(_row(run, users, round_))
                print(json.dumps(rows[-1]), flush=True)
    summary = _summary(rows)
    meta = {
        "cpu": read_cpuinfo().model,
        "itl_s": args.itl,
        "window_s": args.window,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1))
    print(
        f"{'proc':>4} {'users':>5} {'offered':>8} {'carried':>8} {'per proc':>8} "
        f"{'cores':>5} {'ev/cpu-s':>9} {'TTFT99':>7} {'ITL99':>6}"
    )
    for s in summary:
        print(
            f"{s['processes']:>4} {s['users']:>5} {s['offered_events_s']:>8.0f} "
            f"{s['carried_events_s']:>8.0f} {s['events_s_per_process']:>8.0f} "
            f"{s['busiest_process_cores']:>5.2f} {s['events_per_cpu_s']:>9.0f} "
            f"{s['ttft_p99_ms']:>6.1f}ms {s['itl_p99_ms']:>5.1f}ms"
        )
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
