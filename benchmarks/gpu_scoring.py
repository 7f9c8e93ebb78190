"""A run on a GPU landscape (tuner.testing.gpu_landscape) and its score.

Scored as benchmarks.scoring scores a CPU table's runs, but per GPU: the objective is output
tokens/s per GPU (TP) under P99 TTFT and P99 TPOT SLOs, and the hypervolume is over (tok/s per
GPU, tok/s per user), both maximised, from (0, 0).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.scoring import HV_AT, TARGET, run_columns
from tuner.testing.gpu_landscape import GpuLandscape, GpuSlo
from tuner.testing.landscape import Key, hypervolume_2d
from tuner.testing.run_trace import RunTrace


# ---- the reference -------------------------------------------------------------------------
@dataclass
class GpuReference:
    slo: GpuSlo
    best_key: Key
    best_value: float  # true tok/s per GPU of the grid's best feasible configuration
    feasible_share: float
    defaults_score: float  # vLLM's defaults at their true value / the best (0: infeasible)
    hv_grid: float


def percentile_slo(land: GpuLandscape, level: float) -> GpuSlo:
    """The P99 TTFT and P99 TPOT SLOs each at the ``level``-th percentile of the configurations
    that start (numpy's linear interpolation), each off the line: a low level leaves few
    configurations feasible, a high one many, so one landscape asks several questions."""
    ok = [land.true(k) for k in land.grid_keys() if land.true(k).ok]
    ttft = [m.p99_ttft_s for m in ok if m.p99_ttft_s is not None]
    tpot = [m.p99_tpot_s for m in ok if m.p99_tpot_s is not None]
    return GpuSlo(off_the_line(ttft, level), off_the_line(tpot, level))


def median_slo(land: GpuLandscape) -> GpuSlo:
    """The median P99 TTFT and P99 TPOT over the configurations that start, each off the line."""
    return percentile_slo(land, 50.0)


def off_the_line(values: Sequence[float], level: float = 50.0) -> float:
    """The ``level``-th percentile (the median by default), moved half-way to the next larger
    value where configurations sit on it.

    A percentile that falls on a value (the median of an odd count, a tied middle) is some
    configurations' own P99: each noisy reading of them is then a coin flip on the SLO, which
    no real SLO is drawn to be. Moving up to half the gap keeps the true landscape as it was
    (nothing lies in between, so the same configurations meet the SLO) and gives those on the
    line half the gap as their margin.
    """
    v = np.sort(np.asarray(values, dtype=float))
    # np.median at 50: bit for bit the SLO of the replays published before the levels
    # (percentile's interpolation may differ from the middles' mean in the last bit).
    line = float(np.median(v)) if level == 50.0 else float(np.percentile(v, level))
    if not np.any(np.isclose(v, line, rtol=1e-9, atol=0.0)):
        return line
    above = v[v > line * (1 + 1e-9)]
    return (line + float(above[0])) / 2 if above.size else line


def reference(land: GpuLandscape, slo: GpuSlo) -> GpuReference:
    grid = land.grid_keys()
    feasible = [k for k in grid if slo.met(land.true(k))]
    if not feasible:
        raise SystemExit(f"no configuration meets {slo}")
    best = max(feasible, key=land.per_gpu)
    ref = GpuReference(slo, best, land.per_gpu(best), len(feasible) / len(grid), 0.0, 0.0)
    ref.defaults_score = score(land, ref, land.key({}))
    ref.hv_grid = hypervolume(land, grid)
    return ref


def hypervolume(land: GpuLandscape, keys: Sequence[Key]) -> float:
    """HV of (tok/s per GPU, tok/s per user) over configurations that started, from (0, 0)."""
    pts = [(-land.per_gpu(k), -land.per_user(k)) for k in set(keys) if land.true(k).ok]
    return hypervolume_2d(pts, (0.0, 0.0))


# ---- scoring a run ---------------------------------------------------------------------------
def score(land: GpuLandscape, ref: GpuReference, key: Key | None) -> float:
    """True tok/s per GPU over the best feasible one; 0 if nothing or truly infeasible."""
    if key is None or not ref.slo.met(land.true(key)):
        return 0.0
    return land.per_gpu(key) / ref.best_value


def best_observed(trace: RunTrace, land: GpuLandscape, slo: GpuSlo) -> list[Key | None]:
    """After each launch: the best launch so far that *observed* its SLOs met."""
    out: list[Key | None] = []
    best: tuple[float, Key] | None = None
    for launch in trace.launches:
        value = land.per_gpu(launch.key, launch.observed)
        if slo.met(launch.observed) and (best is None or value > best[0]):
            best = (value, launch.key)
        out.append(best[1] if best else None)
    return out


def summarize_run(trace: RunTrace, land: GpuLandscape, ref: GpuReference) -> dict[str, Any]:
    """The columns of benchmarks.scoring.summarize_run, scored per GPU, plus the hand-over
    against vLLM's defaults (the study's baseline): strictly worse, and worse by > 3 %."""
    scores = [score(land, ref, k) for k in trace.selected]
    seen = [score(land, ref, k) for k in best_observed(trace, land, ref.slo)]
    row = run_columns(trace, scores, seen, land.params_of)
    final = scores[-1] if scores else 0.0  # unrounded: the defaults' score is compared exactly
    row |= {
        "worse_than_defaults": final < ref.defaults_score - 1e-9,
        "worse_than_defaults_3pct": final < ref.defaults_score - (1 - TARGET),
        # what the study says of its hand-over: it meets the SLOs, and on an SLO's edge
        "believed_feasible": trace.believed_feasible,
        "on_edge": list(trace.on_edge),
    }
    for t in HV_AT:
        row[f"hv_at_{t}"] = round(
            hypervolume(land, [launch.key for launch in trace.launches[:t]]) / ref.hv_grid, 4
        )
    return row


def handed_worse(rows: Sequence[dict[str, Any]], key: str) -> str:
    return f"{sum(1 for r in rows if r[key])}/{len(rows)}"


def edge_flags(rows: Sequence[dict[str, Any]]) -> str:
    """Of the hand-overs the study believed feasible: how many of the truly infeasible ones,
    and how many of the truly feasible ones, it said were on an SLO's edge."""
    believed = [r for r in rows if r["believed_feasible"]]
    if not believed:
        return "-"  # no study, or none that believed its hand-over met the SLOs
    wrong = [r for r in believed if r["final_score"] == 0]
    right = [r for r in believed if r["final_score"] > 0]
    caught, alarms = (sum(1 for r in group if r["on_edge"]) for group in (wrong, right))
    return f"{caught}/{len(wrong)} infeasible, {alarms}/{len(right)} feasible"


def median_launches(rows: Sequence[dict[str, Any]]) -> float:
    return float(statistics.median(r["launches"] for r in rows))
