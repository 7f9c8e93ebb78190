"""The replay harness (benchmarks/replay.py) on a small synthetic table: 2 params x 3 values.

The table is built so that the answer is known: throughput grows with both params, latency
too, and an SLO of 2.6 s cuts the largest configurations off; two repeats per
configuration differ by 1 %, far less than the gaps between configurations, so the full grid
must find the best feasible configuration exactly, by the grid size, whatever the seed.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUPS = {"first": ["max_num_seqs"], "second": ["max_num_batched_tokens"]}
SEQS, TOKENS = [4, 16, 64], [512, 2048, 8192]


def _load_replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_replay", ROOT / "benchmarks/replay.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_replay"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def replay() -> ModuleType:
    return _load_replay()


def _write_table(path: Path) -> None:
    cols = ["max_num_seqs", "max_num_batched_tokens", "status", "reason", "p50_e2e_s"]
    cols += ["p99_e2e_s", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s"]
    cols += ["output_tok_s", "request_per_s", "error_rate", "completed", "failed"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for i, s in enumerate(SEQS):
            for j, b in enumerate(TOKENS):
                for rep, jitter in enumerate((0.995, 1.005)):
                    tok = (1000 + 400 * i + 150 * j) * jitter
                    p99 = (1.0 + i + 0.4 * j) * jitter
                    w.writerow({
                        "max_num_seqs": s, "max_num_batched_tokens": b, "status": "ok",
                        "reason": "", "p50_e2e_s": p99 / 2, "p99_e2e_s": p99,
                        "p50_ttft_s": 0.1, "p99_ttft_s": 0.2, "p50_tpot_s": 0.01,
                        "p99_tpot_s": 0.02, "output_tok_s": tok, "request_per_s": tok / 64,
                        "error_rate": 0.0, "completed": 100 + rep, "failed": 0,
                    })  # fmt: skip


def test_replay_on_synthetic_table(replay: ModuleType, tmp_path: Path) -> None:
    table = tmp_path / "grid.csv"
    _write_table(table)
    params = [p for ps in GROUPS.values() for p in ps]
    # An absent flag takes the smallest value: the staged runs start from (4, 512).
    land = replay.Landscape.from_csv(
        table, params, {"max_num_seqs": 4, "max_num_batched_tokens": 512}
    )
    strategies = [
        replay.StudyStrategy("staged_tpe", "staged", "tpe", 3, repeats=1),
        replay.StudyStrategy("joint_random", "joint", "random", 4, repeats=1, n_startup_trials=0),
    ]
    # The default SLO is the grid's median P99: (16, 2048) at 2.4 s. A repeat 0.5 % above it
    # would be infeasible, so the test sets 2.6 s: 5 of 9 feasible, none within 7 % of it.
    assert replay.median_slo(land) == pytest.approx(2.4)
    result = replay.replay(land, replay.base_config(), GROUPS, 3, strategies, slo=2.6)

    ref = result["reference"]
    assert ref["grid_size"] == 9
    assert ref["feasible_share"] == pytest.approx(5 / 9)
    assert ref["best_config"] == {"max_num_seqs": 16, "max_num_batched_tokens": 2048}

    runs = result["runs"]
    names = {"defaults", "grid", "staged_tpe", "joint_random"}
    assert {r["strategy"] for r in runs} == names
    assert len(runs) == 3 * len(names)
    for r in runs:
        assert r["launches"] >= 1
        assert 0.0 <= r["final_score"] <= 1.0 + 1e-9
        assert all(0.0 <= r[f"hv_at_{t}"] <= 1.0 + 1e-9 for t in replay.HV_AT)
        t97 = r["trials_to_97"]
        assert t97 is None or 1 <= t97 <= r["launches"]
    grid_runs = [r for r in runs if r["strategy"] == "grid"]
    for r in grid_runs:
        assert r["launches"] == 9
        assert r["final_score"] == pytest.approx(1.0)
        assert r["trials_to_97"] is not None and r["trials_to_97"] <= 9
        assert r["hv_at_20"] == pytest.approx(1.0)
    # The defaults (4, 512) are feasible but the slowest: 1000 / 1550 of the best.
    for r in runs:
        if r["strategy"] == "defaults":
            assert r["final_score"] == pytest.approx(1000 / 1550, rel=0.02)

    summary = {s["strategy"]: s for s in result["summary"]}
    assert set(summary) == names
    assert summary["grid"]["reached_97"] == "3/3"
    assert not math.isnan(summary["staged_tpe"]["median_final_score"])
