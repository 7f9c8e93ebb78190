"""The landscapes measure_grid.py measures, and benchmarks/precision.py's paired fp8/auto ratios
on a small table with known answers."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from benchmarks.measure_grid import GRIDS
from benchmarks.precision import load, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_batching_grid_ids_and_columns_match_the_measured_table() -> None:
    """The replay's table was measured before grids were a registry: same ids, same header."""
    grid = GRIDS["batching"]
    frame = pd.read_csv(ROOT / "benchmarks/data/grid_vllm_cpu.csv")
    assert set(frame["config_id"]) == {p.config_id for p in grid.points()}
    assert list(frame.columns) == grid.columns
    assert len(grid.points()) == 4 * 3 * 2 + 2


def test_precision_grid_pairs_every_batch_limit_with_both_kv_dtypes() -> None:
    points = GRIDS["precision"].points()
    ids = [p.config_id for p in points]
    assert len(set(ids)) == len(ids) == 8
    assert {"s16-kvauto", "s16-kvfp8", "default-kvauto", "default-kvfp8"} <= set(ids)
    by_id = {p.config_id: p.params for p in points}
    assert by_id["default-kvauto"] == {} and by_id["default-kvfp8"] == {"kv_cache_dtype": "fp8"}
    assert GRIDS["precision"].fixed == {"kv_cache_dtype": "auto"}  # what a row records for {}


def _row(seqs: Any, kv: str, rep: int, rate: float, p99: float, ok: bool = True) -> dict[str, Any]:
    row = {c: "" for c in GRIDS["precision"].columns}
    row.update(
        config_id=f"s{seqs}-kv{kv}",
        repeat=rep,
        max_num_seqs=seqs,
        kv_cache_dtype=kv,
        status="ok" if ok else "failed",
        reason="" if ok else "startup_failed",
        loadavg_1m=2.0,
        started_at=f"2026-11-30T15:0{rep}:00",
        kv_cache_tokens=1000,
    )
    if ok:
        row.update(
            output_token_rate=rate,
            p99_e2e_s=p99,
            p50_e2e_s=p99 / 2,
            p50_ttft_s=0.1,
            p99_ttft_s=0.2,
            p50_tpot_s=0.01,
            kv_cache_tokens=2000 if kv == "fp8" else 1000,
        )
    return row


def test_ratios_are_paired_within_a_repeat_and_failures_are_listed(tmp_path: Path) -> None:
    rows = [
        _row(16, "auto", 0, 100, 1.0),
        _row(16, "fp8", 0, 80, 1.5),  # 0.8, 1.5
        _row(16, "auto", 1, 200, 2.0),
        _row(16, "fp8", 1, 180, 2.0),  # 0.9, 1.0: a slow drift
        _row("", "auto", 0, 100, 1.0),
        _row("", "fp8", 0, 70, 1.2),  # vLLM's default batch
        _row(64, "auto", 0, 100, 1.0),
        _row(64, "fp8", 0, 0, 0, ok=False),  # no pair
    ]
    path = tmp_path / "precision.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=GRIDS["precision"].columns)
        writer.writeheader()
        writer.writerows(rows)
    result = summarize(load(path))
    medians = {r["max_num_seqs"]: r for r in result["median_ratio_fp8_over_auto"]}
    assert set(medians) == {"16", "default", "all", "all (25 %)", "all (75 %)"}
    assert medians["16"]["pairs"] == 2 and medians["all"]["pairs"] == 3
    assert medians["16"]["output_token_rate"] == pytest.approx(0.85)
    assert medians["16"]["p99_e2e_s"] == pytest.approx(1.25)
    assert medians["default"]["output_token_rate"] == pytest.approx(0.7)
    assert medians["all"]["output_token_rate"] == pytest.approx(0.8)
    assert medians["all"]["kv_cache_tokens"] == pytest.approx(2.0)
    assert medians["all (25 %)"]["output_token_rate"] == pytest.approx(0.75)  # of 0.7, 0.8, 0.9
    order = [r["max_num_seqs"] for r in result["median_ratio_fp8_over_auto"]]
    assert order[:2] == ["16", "default"]
    assert [(r["config_id"], r["reason"]) for r in result["failed"]] == [
        ("s64-kvfp8", "startup_failed")
    ]
    means = {(r["max_num_seqs"], r["kv_cache_dtype"]): r for r in result["means"]}
    assert means[("16", "auto")]["output_token_rate"] == pytest.approx(150)
    assert means[("64", "auto")]["repeats"] == 1 and ("64", "fp8") not in means
