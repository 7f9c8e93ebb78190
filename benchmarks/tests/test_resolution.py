"""benchmarks/resolution.py: twin groups of identical servers on a table with known answers, and
the twins grid of measure_grid.py."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from benchmarks.measure_grid import GRIDS
from benchmarks.resolution import group_summary, twin_table


def test_twins_grid_is_identical_eager_servers_for_64_users() -> None:
    grid = GRIDS["twins"]
    by_id = {p.config_id: p.params for p in grid.points()}
    assert set(by_id) == {"s64-b2048", "s256-b2048", "s64-b8192", "s256-b8192", "default-eager"}
    assert all(p["max_num_seqs"] >= 64 for p in by_id.values() if p)
    # The fixed eager flag is not an axis, yet every row must record it.
    assert "enforce_eager" in grid.columns and grid.fixed == {"enforce_eager": True}


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    columns = GRIDS["batching"].columns
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" for c in columns} | row)


def _row(cid: str, seqs: Any, tokens: Any, eager: bool, rate: float, ok: bool = True) -> dict:
    return dict(
        config_id=cid,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        enforce_eager=eager,
        status="ok" if ok else "failed",
        output_token_rate=rate,
    )


def test_twin_groups_join_limits_above_the_users_and_leave_compiled_out(tmp_path: Path) -> None:
    path = tmp_path / "grid.csv"
    _write(
        path,
        [
            _row("s64-b2048-eager", 64, 2048, True, 100),
            _row("s64-b2048-eager", 64, 2048, True, 110),
            _row("s256-b2048-eager", 256, 2048, True, 120),
            _row("default-eager", "", "", True, 90),  # 128 / 2048: a third twin
            _row("s16-b2048-eager", 16, 2048, True, 50),  # 16 running: no twin
            _row("s256-b2048-compiled", 256, 2048, False, 500),  # compiled: left out
            _row("s64-b8192-eager", 64, 8192, True, 80, ok=False),  # failed: left out
        ],
    )
    table = twin_table(path, concurrency=64, metric="output_token_rate")
    assert set(table["config_id"]) == {
        "s64-b2048-eager",
        "s256-b2048-eager",
        "default-eager",
        "s16-b2048-eager",
    }
    s64 = table.set_index("config_id").loc["s64-b2048-eager"]
    assert s64["mean"] == pytest.approx(105) and s64["repeat_spread"] == pytest.approx(0.1)
    summary = group_summary(table)
    assert list(summary.index) == ["eager, 64 running, b2048"]
    row = summary.loc["eager, 64 running, b2048"]
    assert row["twins"] == 3 and row["twin_spread"] == pytest.approx(120 / 90 - 1)
