"""The study's pooled noise (tuner/noise.py) and what it changes in the acceptance rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tuner.study.decision.acceptance import Comparison, decide
from tuner.study.decision.noise import NoiseEstimate, NoisePool, NoiseSplit


def test_the_estimate_pools_log_variance_over_repeated_configurations() -> None:
    s = 0.1
    est = NoiseEstimate.of(
        [math.exp(-s), math.exp(s)], [5.0 * math.exp(-2 * s), 5.0 * math.exp(2 * s)]
    )
    # logs +-s and +-2s: sum of squares 2s^2 + 8s^2 over 2 degrees of freedom
    assert est.df == 2 and est.rel_sd == pytest.approx(math.sqrt(5) * s)
    # single windows, failures (inf, nan) and zeros carry no information about the spread
    same = NoiseEstimate.of(
        [math.exp(-s), math.exp(s), float("inf")],
        [7.0],
        [0.0, 5.0 * math.exp(-2 * s), 5.0 * math.exp(2 * s), float("nan")],
    )
    assert same == est
    unknown = NoiseEstimate.of([1.0], [])
    assert unknown.df == 0 and unknown.threshold(3, 3, 100.0) == 0.0


def test_the_threshold_is_students_t_and_narrows_as_the_study_learns_its_noise() -> None:
    few, many = NoiseEstimate(0.1, 2), NoiseEstimate(0.1, 40)
    assert few.threshold(2, 2, 1000.0) == pytest.approx(stats.t.ppf(0.975, 2) * 0.1 * 1000.0)
    assert many.threshold(2, 2, 1000.0) < 0.5 * few.threshold(2, 2, 1000.0)
    assert many.threshold(8, 8, 1000.0) == pytest.approx(many.threshold(2, 2, 1000.0) / 2)
    assert many.threshold(2, 2, -1000.0) == many.threshold(2, 2, 1000.0)  # a scale, not a sign


def test_the_pool_keeps_each_configurations_longest_run_of_measurements() -> None:
    pool = NoisePool()
    pool.add({"a": 1, "b": 2}, [100.0, 110.0])
    pool.add({"b": 2, "a": 1}, [100.0, 110.0, 90.0, 105.0])  # the same config, grown
    pool.add({"a": 1, "b": 2}, [100.0, 110.0])  # a resumed study adds the old list again
    pool.add({}, [50.0])
    est = pool.estimate()
    assert est.df == 3
    assert est == NoiseEstimate.of([100.0, 110.0, 90.0, 105.0])


def _accept_rate(gain: float, cv: float, n: int, prior_df: int, pooled: bool) -> float:
    """How often decide() accepts a candidate ``gain`` better than the incumbent, both measured
    ``n`` times with log-normal noise of ``cv``, the study having seen ``prior_df`` more degrees
    of freedom of the same noise (earlier stages' repeats)."""
    rng = np.random.default_rng(7)
    accepted = 0
    draws = 3000
    for _ in range(draws):
        inc = list(1000.0 * np.exp(rng.normal(0, cv, n)))
        cand = list(1000.0 * (1 + gain) * np.exp(rng.normal(0, cv, n)))
        earlier = [list(np.exp(rng.normal(0, cv, 2))) for _ in range(prior_df)]
        noise = NoiseEstimate.of(inc, cand, *earlier) if pooled else None
        d = decide(Comparison("s", "tok_s", "maximize", inc, cand, True, 0.03, pooled=noise))
        accepted += d.accepted
    return accepted / draws


@pytest.mark.parametrize("cv", [0.05, 0.10])
def test_with_one_repeat_the_pair_rule_takes_equal_configs_for_gains_and_pooling_does_not(
    cv: float,
) -> None:
    """The quickstart's 2 + 2 measurements: the pair rule's two standard errors of a 2-df
    variance accept an equal candidate in 7-9 % of comparisons; the pooled rule's t stays
    near its nominal 2.5 %."""
    pair = _accept_rate(0.0, cv, 2, 0, pooled=False)
    pooled = _accept_rate(0.0, cv, 2, 0, pooled=True)
    assert pair > 0.06 and pooled < 0.04 and pooled < pair / 2


def test_pooling_the_studys_repeats_keeps_the_power_to_prove_a_real_gain() -> None:
    """A 20 % gain at 5 % noise, 3 measurements a side: once earlier stages have taught the
    study its noise (6 more df), the pooled rule proves it about as often as the pair rule,
    which bought its power with false acceptances (above)."""
    pair = _accept_rate(0.2, 0.05, 3, 6, pooled=False)
    pooled = _accept_rate(0.2, 0.05, 3, 6, pooled=True)
    assert pooled > 0.95 and pooled > pair - 0.03


def _launches(
    rng: np.random.Generator, n: int, k: int, sd_launch: float, sd_slice: float
) -> list[list[float]]:
    offsets = rng.normal(0, sd_launch, size=(n, 1))
    return np.exp(np.log(1000) + offsets + rng.normal(0, sd_slice, size=(n, k))).tolist()


def test_the_split_finds_and_sizes_launch_effects() -> None:
    split = NoiseSplit.of(_launches(np.random.default_rng(1), 40, 4, 0.10, 0.02))
    assert split is not None
    assert split.slice_sd == pytest.approx(0.02, rel=0.15)
    assert split.launch_sd == pytest.approx(0.10, rel=0.25)
    assert split.p_launches_differ < 1e-6
    # a launch's mean: the launch effect plus a quarter of one slice's variance
    assert split.launch_mean_sd == pytest.approx(math.sqrt(0.10**2 + 0.02**2 / 4), rel=0.25)


def test_slices_alone_leave_no_launch_effect() -> None:
    split = NoiseSplit.of(_launches(np.random.default_rng(2), 40, 4, 0.0, 0.05))
    assert split is not None
    assert split.slice_sd == pytest.approx(0.05, rel=0.15)
    assert split.launch_sd < 0.015 and split.p_launches_differ > 0.01


def test_the_split_needs_two_launches_of_equal_positive_slices() -> None:
    assert NoiseSplit.of([[1.0, 2.0]]) is None
    assert NoiseSplit.of([[1.0], [2.0]]) is None
    assert NoiseSplit.of([[1.0, 2.0], [1.0, 2.0, 3.0]]) is None
    assert NoiseSplit.of([[1.0, 2.0], [0.0, 2.0]]) is None  # a slice without a token
    assert NoiseSplit.of([[1.0, 2.0], [float("nan"), 2.0]]) is None
    assert NoiseSplit.of([[1.0, 2.0], [1.5, 2.5]]) is not None
