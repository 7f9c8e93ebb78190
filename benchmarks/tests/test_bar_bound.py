"""The bar's bound (benchmarks/bar_bound.py): the oracle's chance of proving a point agrees with
the landscape's own noise, its window count is the least that suffices, and a cell reads
unattainable exactly where the cheapest proof costs more than the budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from benchmarks import bar_bound
from tuner.testing.gpu_landscape import GPU_PARAM, GpuLandscape, GpuSlo, point

SLO = GpuSlo(p99_ttft_s=1.0, p99_tpot_s=0.02)


def landscape(ttft_levels: list[float], cv: float = 0.0) -> GpuLandscape:
    """One point per TP 1..k, all worth the same tok/s per GPU, TTFT at the given levels of the
    SLO and TPOT at half its SLO."""
    truths = {}
    for tp, level in enumerate(ttft_levels, start=1):
        m = point(100.0, tp, ttft_s=level * SLO.p99_ttft_s)
        truths[(tp,)] = dataclasses.replace(m, p50_tpot_s=0.01, p99_tpot_s=0.01)
    return GpuLandscape([GPU_PARAM], truths, {GPU_PARAM: 1}, cv)


def test_the_chance_matches_the_rule_applied_to_the_landscapes_own_draws() -> None:
    cv, windows = 0.05, 4
    land = landscape([0.95], cv)
    rng = np.random.default_rng(7)
    z = float(stats.norm.ppf(bar_bound.CONFIDENCE))
    met, runs = 0, 4000
    for _ in range(runs):
        draws = [land.draw((1,), rng) for _ in range(windows)]
        ttft = np.mean([d.p99_ttft_s for d in draws]) / SLO.p99_ttft_s
        tpot = np.mean([d.p99_tpot_s for d in draws]) / SLO.p99_tpot_s
        bound = 1 + z * cv / np.sqrt(windows)
        met += bool(ttft * bound <= 1 and tpot * bound <= 1)
    want = bar_bound.proof_chance(bar_bound.levels(land, (1,), SLO), cv, windows, 0.9)
    se = np.sqrt(want * (1 - want) / runs)
    assert 0.2 < want < 0.9  # a point the rule proves only sometimes at 4 windows
    assert abs(met / runs - want) < 4 * se


def test_the_windows_are_the_fewest_that_prove_it_in_19_of_20_seeds() -> None:
    for level, cv in ((0.97, 0.02), (0.95, 0.05), (0.99, 0.05)):
        n = bar_bound.windows_needed((level, 0.5), cv)
        assert n is not None and n > 1
        assert bar_bound.proof_chance((level, 0.5), cv, n, 0.9) >= bar_bound.SEEDS_SHARE
        assert bar_bound.proof_chance((level, 0.5), cv, n - 1, 0.9) < bar_bound.SEEDS_SHARE
    # the closer to the limit, or the noisier, the more windows
    assert bar_bound.windows_needed((0.99, 0.5), 0.05) > bar_bound.windows_needed((0.95, 0.5), 0.05)
    assert bar_bound.windows_needed((0.97, 0.5), 0.05) > bar_bound.windows_needed((0.97, 0.5), 0.02)
    assert bar_bound.windows_needed((1.0, 0.5), 0.02) is None  # on the limit: never


def test_a_cell_is_unattainable_only_where_its_cheapest_proof_exceeds_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bar_bound, "percentile_slo", lambda land, level: SLO)
    on_edge = bar_bound.cell("edge", landscape([0.995] * 40), 50, 0.05)
    assert on_edge.budget == 2 and on_edge.worth_it == 40
    assert on_edge.windows is not None and on_edge.windows > on_edge.budget
    assert not on_edge.attainable
    # one point of the same worth with room to spare makes the cell attainable
    roomy = bar_bound.cell("roomy", landscape([0.995] * 39 + [0.7]), 50, 0.05)
    assert roomy.windows == 1 and roomy.attainable
    assert abs(roomy.best_margin - 0.3) < 1e-9
