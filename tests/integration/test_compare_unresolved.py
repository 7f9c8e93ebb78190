"""`tuner compare` where its budget cannot resolve what it is asked: unresolved, exit 3, no window
past the budget. It runs alone, not beside other tests: a busy host does not only widen what the
compare cannot resolve, it can shift one side's tail between windows (identical servers read
B's P99 E2E 15 % worse, 95 % CI 1.03-1.29, beside three test workers), a false "worse"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.integration.test_compare_endpoint import FAST, WORKLOAD
from tuner.cli import main
from tuner.testing.sse_server import FakeServer

pytestmark = pytest.mark.integration


def test_a_resolution_out_of_reach_is_unresolved_exit_3_within_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Identical servers asked for a 0.1 % resolution, which two windows a side give only where
    the windows read the same (the fake's closed-loop throughput can): every other objective
    is unresolved, never "within noise", the run exits 3, and it measures no window past its
    budget (what more it would need is in the row)."""
    with FakeServer(FAST) as a, FakeServer(FAST) as b:
        rc = main(
            [
                "compare",
                "--url-a",
                a.url,
                "--url-b",
                b.url,
                "--windows",
                "2",
                "--max-windows",
                "2",
                "--out",
                str(tmp_path),
                *WORKLOAD,
                "check.resolve=0.001",
            ]
        )
    report = json.loads((tmp_path / "compare.json").read_text())
    rows = {str(r["objective"]): r for r in report["objectives"]}
    assert rc == 3
    assert report["order"] == "ABBA"  # two windows a side: the budget, nothing more
    unresolved = [r for r in rows.values() if r["decision"] == "unresolved"]
    assert unresolved and rows["p99_e2e_latency"] in unresolved  # a tail never reads the same
    for r in rows.values():
        assert (r["decision"] == "within noise") == (r["resolution"] <= 0.001), r
    # each unresolved row says what would resolve it: more windows of each, or that no number
    # would (a P99 whose spread is known but wide for 0.1 % needs more than any budget)
    table = capsys.readouterr().out
    for r in unresolved:
        assert r["needs"] is None or r["needs"] > 0, r
        line = next(ln for ln in table.splitlines() if ln.strip().startswith(str(r["objective"])))
        if r["needs"] is not None:
            assert f"needs {r['needs']} more windows of each" in line, line
        elif math.isfinite(r["resolution"]):
            assert "more windows cannot resolve it" in line, line
        else:
            assert "noise unknown" in line, line
