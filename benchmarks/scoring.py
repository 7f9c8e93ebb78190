"""A search run's score: its trace (tuner.testing.run_trace: launches in order, what it would
hand over after each) against the landscape's truth.

Scored against the landscape's reference: the selection after t launches at its *true* value
over the grid's best feasible one (0 if truly infeasible), the first t reaching 97 %, and the
hypervolume of everything launched so far relative to the grid's.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner.testing.landscape import MAX_ERROR_RATE, Key, Landscape, Reference, hypervolume
from tuner.testing.run_trace import Launch, RunTrace

TARGET = 0.97
HV_AT = (5, 10, 20)
BUDGET_SHARE = 0.10  # the target's budget: 10 % of the grid's trials


def best_observed(launches: Sequence[Launch], land: Landscape, slo: float) -> list[Key | None]:
    """After each launch: the best feasible launch so far by its *observed* values."""
    out: list[Key | None] = []
    best: tuple[float, Key] | None = None
    for launch in launches:
        o = launch.observed
        feasible = o.ok and (o.p99_e2e_s or math.inf) <= slo and o.error_rate <= MAX_ERROR_RATE
        if feasible and (best is None or o.output_tok_s > best[0]):
            best = (o.output_tok_s, launch.key)
        out.append(best[1] if best else None)
    return out


def score(land: Landscape, ref: Reference, key: Key | None) -> float:
    if key is None:
        return 0.0
    t = land.truth(key)
    return t.output_tok_s / ref.best_value if t.feasible(ref.slo_p99_e2e_s) else 0.0


def first_reaching(scores: Sequence[float]) -> int | None:
    return next((i + 1 for i, s in enumerate(scores) if s >= TARGET - 1e-12), None)


def worse_switches(selected: Sequence[Key | None], scores: Sequence[float]) -> int:
    """How often the run traded what it held for a configuration truly worse by more than the
    target's resolution (3 % of the optimum, or truly infeasible): noise taken for a gain."""
    held = list(zip(selected, scores, strict=True))
    return sum(
        1
        for (k0, s0), (k1, s1) in itertools.pairwise(held)
        if k0 is not None and k1 != k0 and s1 < s0 - (1 - TARGET)
    )


def baseline_launches(trace: RunTrace) -> int:
    """How many of the run's first launches measured the baseline (StudyRunner runs: 3)."""
    n = sum(1 for launch in trace.launches if launch.label == "baseline")
    if any(launch.label != "baseline" for launch in trace.launches[:n]):
        raise ValueError(f"{trace.strategy} seed {trace.seed}: a baseline launch after the search")
    return n


def without_baseline(t: int | None, stored: int) -> int | None:
    """Launches to 97 % for a study that reuses a stored baseline of the same fingerprint
    (a study stores one per host, model, workload and fixed args): the baseline's launches cost
    nothing; 0 when the stored baseline itself is the answer."""
    return None if t is None else max(0, t - stored)


def run_columns(
    trace: RunTrace,
    scores: Sequence[float],
    seen_scores: Sequence[float],
    params_of: Callable[[Key], Any],
) -> dict[str, Any]:
    """The columns every replay scores a run by, whatever its landscape: launches to 97 % of
    the optimum as handed over (``scores``, one per selection) and as seen (``seen_scores``,
    the best launch so far), with and without a stored baseline, and what it handed over."""
    reached, seen = first_reaching(scores), first_reaching(seen_scores)
    stored = baseline_launches(trace)
    last = trace.selected[-1] if trace.selected else None
    return {
        "strategy": trace.strategy,
        "seed": trace.seed,
        "launches": len(trace.launches),
        "baseline_launches": stored,
        "trials_to_97": reached,
        "trials_to_97_seen": seen,
        "trials_to_97_stored_baseline": without_baseline(reached, stored),
        "trials_to_97_seen_stored_baseline": without_baseline(seen, stored),
        "final_score": round(scores[-1], 4) if scores else 0.0,
        "worse_switches": worse_switches(trace.selected, list(scores)),
        "final_config": None if last is None else params_of(last),
        "distinct_configs": len({launch.key for launch in trace.launches}),
        "failed_launches": sum(not launch.observed.ok for launch in trace.launches),
        "stopped": trace.stopped,
        "independent_samples": trace.independent_samples,
    }


def summarize_run(trace: RunTrace, land: Landscape, ref: Reference) -> dict[str, Any]:
    scores = [score(land, ref, k) for k in trace.selected]
    # The best launch seen so far (no acceptance step): the sampler's search efficiency alone.
    seen = [score(land, ref, k) for k in best_observed(trace.launches, land, ref.slo_p99_e2e_s)]
    row = run_columns(trace, scores, seen, land.params_of)
    for t in HV_AT:
        launched = {launch.key for launch in trace.launches[:t]}
        hv = hypervolume([land.truth(k) for k in launched], ref.ref_point)
        row[f"hv_at_{t}"] = round(hv / ref.hv_grid, 4)
    return row


def _median_trials(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    """Median over seeds; a seed that never reached 97 % counts as infinitely many trials."""
    med = statistics.median(math.inf if r[key] is None else r[key] for r in rows)
    return med if math.isfinite(med) else None


def _within(rows: Sequence[dict[str, Any]], key: str, budget: float) -> str:
    """Seeds whose ``key`` (launches to 97 %) is within the budget, as "k/n"."""
    return f"{sum(1 for r in rows if r[key] is not None and r[key] <= budget)}/{len(rows)}"


def aggregate(rows: Sequence[dict[str, Any]], grid_size: int) -> list[dict[str, Any]]:
    """One line per strategy: medians over seeds."""
    out = []
    budget = max(1, math.floor(BUDGET_SHARE * grid_size))
    for name in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == name]
        med = _median_trials(mine, "trials_to_97")
        line: dict[str, Any] = {
            "strategy": name,
            "seeds": len(mine),
            "reached_97": _within(mine, "trials_to_97", math.inf),
            f"reached_97_in_{budget}": _within(mine, "trials_to_97", budget),
            f"seen_97_in_{budget}": _within(mine, "trials_to_97_seen", budget),
            "median_trials_to_97": med,
            "median_trials_to_97_pct_of_grid": None
            if med is None
            else round(100 * med / grid_size, 1),
            "median_trials_to_97_seen": _median_trials(mine, "trials_to_97_seen"),
            # A later study on the same fingerprint reuses the stored baseline (0 launches).
            f"reached_97_in_{budget}_stored_baseline": _within(
                mine, "trials_to_97_stored_baseline", budget
            ),
            f"seen_97_in_{budget}_stored_baseline": _within(
                mine, "trials_to_97_seen_stored_baseline", budget
            ),
            "median_trials_to_97_stored_baseline": _median_trials(
                mine, "trials_to_97_stored_baseline"
            ),
            # handed over a truly feasible configuration at the end (whatever its score)
            "final_feasible": f"{sum(1 for r in mine if r['final_score'] > 0)}/{len(mine)}",
            "median_final_score": round(statistics.median(r["final_score"] for r in mine), 4),
            # runs that once handed over something truly worse than what they held
            "switched_worse": f"{sum(1 for r in mine if r['worse_switches'])}/{len(mine)}",
            "median_launches": statistics.median(r["launches"] for r in mine),
            "independent_samples": statistics.median(r["independent_samples"] for r in mine),
        }
        for t in HV_AT:
            line[f"median_hv_at_{t}"] = round(statistics.median(r[f"hv_at_{t}"] for r in mine), 4)
        out.append(line)
    return out


def markdown(summary: Sequence[dict[str, Any]]) -> str:
    cols = list(summary[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += [
        "| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |" for r in summary
    ]
    return "\n".join(lines)


def write_markdown(path: Path, preface: str, rows: Sequence[dict[str, Any]]) -> str:
    """A results page: ``preface`` (what each cell is, the seed), then the table; the table."""
    text = markdown(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(preface + "\n\n" + text + "\n")
    return text
