"""A measured landscape: the grid table of benchmarks.measure_grid, its truth and reference.

Each configuration (a key: the params in order, None = flag left out) has its repeats; its
*truth* is the mean over them (infeasible if any repeat failed). The reference is what every
strategy is scored against: the SLO, the grid's best feasible configuration and the grid's
hypervolume over (P99 E2E min, output tok/s max).
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAX_ERROR_RATE = 0.01
Key = tuple[Any, ...]


# ---- the table --------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """CSV cell -> None (empty: the flag was left out), bool, int, float or str."""
    if text in ("", "None"):
        return None
    if text in ("True", "true", "False", "false"):
        return text in ("True", "true")
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _num(text: str) -> float | None:
    return None if text in ("", "None") else float(text)


@dataclass(frozen=True)
class Measured:
    """One measurement of one configuration (a row of the table)."""

    ok: bool
    reason: str
    p50_e2e_s: float | None
    p99_e2e_s: float | None
    p50_ttft_s: float | None
    p99_ttft_s: float | None
    p50_tpot_s: float | None
    p99_tpot_s: float | None
    output_tok_s: float
    request_per_s: float
    error_rate: float
    completed: int
    failed: int

    @classmethod
    def from_row(cls, row: Mapping[str, str], throughput: str = "output_tok_s") -> Measured:
        """A row, with ``throughput`` (a column) as its output tok/s."""
        num = {k: _num(row.get(k, "")) for k in _METRIC_COLUMNS}
        num["output_tok_s"] = _num(row.get(throughput, ""))
        ok = row.get("status") == "ok" and num["p99_e2e_s"] is not None
        return cls(
            ok=ok,
            reason=row.get("reason", "") or ("" if ok else "failed"),
            **{k: num[k] for k in _METRIC_COLUMNS[:6]},
            output_tok_s=num["output_tok_s"] or 0.0,
            request_per_s=num["request_per_s"] or 0.0,
            error_rate=num["error_rate"] if num["error_rate"] is not None else 1.0,
            completed=int(num["completed"] or 0),
            failed=int(num["failed"] or 0),
        )


_METRIC_COLUMNS = (
    "p50_e2e_s",
    "p99_e2e_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "p50_tpot_s",
    "p99_tpot_s",
    "output_tok_s",
    "request_per_s",
    "error_rate",
    "completed",
    "failed",
)


@dataclass(frozen=True)
class Truth:
    """A configuration's value: the mean over its repeats; infeasible if any repeat failed."""

    ok: bool
    p99_e2e_s: float
    output_tok_s: float
    error_rate: float

    def feasible(self, slo_p99_e2e_s: float) -> bool:
        return self.ok and self.p99_e2e_s <= slo_p99_e2e_s and self.error_rate <= MAX_ERROR_RATE


class Landscape:
    """Measured configurations: ``{key: [repeats]}``, a key being the params in order."""

    def __init__(
        self,
        params: Sequence[str],
        table: Mapping[Key, list[Measured]],
        defaults: Mapping[str, Any],
    ) -> None:
        self.params = list(params)
        self.table = dict(table)
        self.defaults = dict(defaults)  # a param a launch leaves out takes this value

    @classmethod
    def from_csv(
        cls,
        path: Path,
        params: Sequence[str],
        defaults: Mapping[str, Any],
        throughput: str = "output_tok_s",
    ) -> Landscape:
        """The table; a successful row without a ``throughput`` value is left out (measured
        before that column existed)."""
        table: dict[Key, list[Measured]] = {}
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row.get("status") == "ok" and not row.get(throughput):
                    continue
                key = tuple(parse_value(row[p]) for p in params)
                table.setdefault(key, []).append(Measured.from_row(row, throughput))
        return cls(params, table, defaults)

    def key(self, args: Mapping[str, Any]) -> Key:
        return tuple(args[p] if p in args else self.defaults.get(p) for p in self.params)

    def params_of(self, key: Key) -> dict[str, Any]:
        return dict(zip(self.params, key, strict=True))

    def draw(self, key: Key, rng: np.random.Generator) -> Measured:
        if key not in self.table:
            raise KeyError(f"configuration {self.params_of(key)} is not in the table")
        repeats = self.table[key]
        return repeats[int(rng.integers(len(repeats)))]

    def truth(self, key: Key) -> Truth:
        reps = self.table[key]
        if not all(r.ok for r in reps):
            return Truth(False, math.inf, 0.0, 1.0)
        return Truth(
            True,
            float(np.mean([r.p99_e2e_s or 0.0 for r in reps])),
            float(np.mean([r.output_tok_s for r in reps])),
            float(np.mean([r.error_rate for r in reps])),
        )

    def values(self) -> dict[str, list[Any]]:
        """Every explicit value of every param, ascending (the grid's axes)."""
        axes: dict[str, set[Any]] = {p: set() for p in self.params}
        for key in self.table:
            for p, v in zip(self.params, key, strict=True):
                if v is not None:
                    axes[p].add(v)
        return {p: sorted(vals, key=lambda v: (str(type(v)), v)) for p, vals in axes.items()}

    def grid_keys(self) -> list[Key]:
        """The full grid in nested order (first param outermost), as vLLM's auto_tune walks it."""
        keys = [tuple(k) for k in itertools.product(*self.values().values())]
        return [k for k in keys if k in self.table]


# ---- the reference: SLO, best feasible, grid hypervolume -----------------------------------
@dataclass
class Reference:
    slo_p99_e2e_s: float
    best_key: Key
    best_value: float
    feasible_share: float
    hv_grid: float
    ref_point: tuple[float, float]


def median_slo(land: Landscape) -> float:
    """The median true P99 E2E over the grid's configurations that ran: ~half are feasible."""
    p99 = [t.p99_e2e_s for k in land.grid_keys() if (t := land.truth(k)).ok]
    return float(np.median(p99))


def reference(land: Landscape, slo: float) -> Reference:
    grid = land.grid_keys()
    feasible = [k for k in grid if land.truth(k).feasible(slo)]
    if not feasible:
        raise SystemExit(f"no configuration of the grid meets P99 E2E <= {slo:.3f} s")
    best = max(feasible, key=lambda k: land.truth(k).output_tok_s)
    ok = [land.truth(k) for k in land.table if land.truth(k).ok]
    ref = (1.1 * max(t.p99_e2e_s for t in ok), 0.0)  # (worst latency + 10 %, zero throughput)
    share = len(feasible) / len(grid)
    hv = hypervolume([land.truth(k) for k in grid], ref)
    return Reference(slo, best, land.truth(best).output_tok_s, share, hv, ref)


def hypervolume(points: Sequence[Truth], ref: tuple[float, float]) -> float:
    """HV of (P99 E2E min, output tok/s max), as losses."""
    losses = [(p.p99_e2e_s, -p.output_tok_s) for p in points if p.ok]
    return hypervolume_2d(losses, (ref[0], -ref[1]))


def hypervolume_2d(losses: Sequence[tuple[float, float]], ref: tuple[float, float]) -> float:
    """The area that ``losses`` (both minimized) dominate up to ``ref``, exactly. Optuna's
    calculator is private API; in two dimensions the exact sweep is a sort: each point, by
    its first loss, adds the strip between its second loss and the best one before it."""
    area, best = 0.0, ref[1]
    for x, y in sorted(p for p in losses if p[0] < ref[0] and p[1] < ref[1]):
        if y < best:
            area += (ref[0] - x) * (best - y)
            best = y
    return area


def _spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean of the repeats; None with fewer than two."""
    return (
        round((max(values) - min(values)) / float(np.mean(values)), 3) if len(values) > 1 else None
    )


def landscape_rows(land: Landscape, slo: float) -> list[dict[str, Any]]:
    """Every configuration's truth and its repeat-to-repeat spread, best first."""
    rows = []
    for key, reps in land.table.items():
        t = land.truth(key)
        tok = [r.output_tok_s for r in reps if r.ok]
        p99 = [r.p99_e2e_s or 0.0 for r in reps if r.ok]
        rows.append(
            {
                **{p: ("default" if v is None else v) for p, v in land.params_of(key).items()},
                "repeats": len(reps),
                "failed": sum(not r.ok for r in reps),
                "output_tok_s": round(t.output_tok_s, 1),
                "p99_e2e_s": round(t.p99_e2e_s, 3),
                "feasible": t.feasible(slo),
                "tok_s_spread": _spread(tok),
                "p99_spread": _spread(p99),
            }
        )
    return sorted(rows, key=lambda r: -r["output_tok_s"])
