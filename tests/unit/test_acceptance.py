"""The acceptance rule: a stage winner replaces the incumbent only beyond the noise."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import optuna
import pytest

from tuner.scoring.feasibility import mean_constraints, meets
from tuner.scoring.objective import NO_DATA_VIOLATION
from tuner.study.decision.acceptance import (
    Comparison,
    Decision,
    decide,
    noise_advice,
    resolution_line,
    resolvable_gain,
)
from tuner.study.decision.noise import NoiseEstimate, NoiseSplit
from tuner.study.decision.stages import Incumbent, stage_winner


def test_clear_gain_is_accepted() -> None:
    d = decide(
        Comparison("batching", "output_throughput", "maximize", [100, 102], [150, 149], True, 0.02)
    )
    assert d.accepted
    assert d.gain == pytest.approx(48.5)
    assert d.threshold >= 0.02 * 101


def test_gain_inside_noise_is_rejected() -> None:
    d = decide(
        Comparison("batching", "output_throughput", "maximize", [100, 140], [125, 150], True, 0.02)
    )
    assert not d.accepted
    assert d.noise > d.gain > 0
    assert "noise" in d.reason


def test_minimize_direction_flips_the_sign() -> None:
    d = decide(
        Comparison("memory", "p99_e2e_latency", "minimize", [1.0, 1.02], [0.5, 0.51], True, 0.02)
    )
    assert d.accepted and d.gain == pytest.approx(0.505)
    worse = decide(
        Comparison("memory", "p99_e2e_latency", "minimize", [0.5, 0.5], [1.0, 1.0], True, 0.02)
    )
    assert not worse.accepted and worse.gain < 0


def test_min_gain_applies_even_without_variance() -> None:
    d = decide(Comparison("s", "x", "maximize", [100.0], [101.0], True, 0.02))
    assert d.noise == 0 and d.threshold == pytest.approx(2.0) and not d.accepted


def test_infeasible_candidate_is_never_accepted() -> None:
    d = decide(Comparison("s", "x", "maximize", [100, 100], [500, 500], False, 0.02))
    assert not d.accepted and "SLO" in d.reason


def test_round_trip_and_line() -> None:
    d = decide(Comparison("s", "x", "maximize", [1, 1.1], [2, 2.1], True, 0.02))
    again = Decision.from_dict(d.to_dict())
    assert again == d
    assert "ACCEPTED" in d.line() and "s" in d.line()


def test_an_infeasible_incumbent_gives_way_to_a_feasible_candidate() -> None:
    # A baseline over the SLO with more throughput: the slower candidate that meets the SLO on the
    # mean of its repeats wins (feasibility first); an infeasible candidate still never does.
    d = decide(
        Comparison(
            "batching",
            "output_throughput",
            "maximize",
            [1085, 1080],
            [967, 960],
            True,
            0.02,
            incumbent_feasible=False,
        )
    )
    assert d.accepted and "incumbent does not meet every SLO" in d.reason and d.gain < 0
    d = decide(
        Comparison("batching", "output_throughput", "maximize", [1085], [967], False, 0.02, False)
    )
    assert not d.accepted
    d = decide(
        Comparison(
            "batching", "output_throughput", "maximize", [1085, 1080], [967, 960], True, 0.02
        )
    )
    assert not d.accepted  # both feasible: the gain rule


def test_with_neither_feasible_the_candidate_that_misses_by_less_is_a_step_forward() -> None:
    # The silicon table's stall: defaults over both SLOs, TP 8 over TTFT by 6 % only. Keeping
    # the incumbent would leave every later stage starting from the defaults.
    def both_infeasible(inc_violation: float, cand_violation: float) -> Decision:
        return decide(
            Comparison(
                "parallelism",
                "tok_s_per_gpu",
                "maximize",
                [300, 302],
                [150, 151],
                False,
                0.02,
                False,
                None,
                inc_violation,
                cand_violation,
            )
        )

    closer = both_infeasible(0.45, 0.06)
    assert closer.accepted and "misses them by less (6.0% vs 45.0%" in closer.reason
    assert closer.gain < 0  # feasibility first: the throughput it gives up does not count
    assert not both_infeasible(0.06, 0.45).accepted
    assert not both_infeasible(0.06, 0.06).accepted  # no step: keep what was measured first
    failed = both_infeasible(NO_DATA_VIOLATION * 2, NO_DATA_VIOLATION)  # a repeat failed
    assert not failed.accepted
    feasible_incumbent = decide(
        Comparison("s", "x", "maximize", [100], [500], False, 0.02, True, None, 0.0, 0.01)
    )
    assert not feasible_incumbent.accepted


def test_constraints_are_met_on_the_mean_and_a_failure_is_never_averaged_away() -> None:
    straddling = [{"p99": -0.1, "err": -1.0}, {"p99": 0.05, "err": -1.0}, {"p99": -0.05}]
    mean = mean_constraints(straddling)
    assert mean == pytest.approx({"p99": -0.1 / 3, "err": -1.0})
    assert meets(mean) and not meets(straddling[1])
    failed = [{"p99": -0.5}, {"p99": NO_DATA_VIOLATION}, {"p99": -0.5}, {"p99": -0.5}]
    assert not meets(mean_constraints(failed))


def _trial(rate: float, p99_violation: float, status: str = "ok") -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        values=[rate],
        user_attrs={"status": status},
        constraints={"p99_e2e_s": p99_violation},
    )


def _incumbent(p99_violation: float) -> Incumbent:
    return Incumbent({}, [1000.0], {"p99_e2e_s": p99_violation}, "baseline")


def test_stage_winner_is_the_best_feasible_trial_not_the_fastest() -> None:
    fast_but_slow_tail, ok, better = _trial(990, 0.4), _trial(900, -0.1), _trial(950, -0.2)
    trials = [fast_but_slow_tail, ok, better, _trial(5000, -1.0, status="failed")]
    assert stage_winner(trials, 0, 1.0, _incumbent(0.5)) is better
    assert stage_winner(trials, 0, -1.0) is ok  # minimizing the selection objective


def test_stage_winner_is_the_nearest_miss_only_against_an_infeasible_incumbent() -> None:
    near, far = _trial(900, 0.2), _trial(990, 0.9)
    assert stage_winner([far, near], 0, 1.0, _incumbent(0.5)) is near
    assert stage_winner([far, near], 0, 1.0, _incumbent(0.1)) is None  # nothing nearer
    assert stage_winner([far, near], 0, 1.0, _incumbent(-0.1)) is None  # a feasible incumbent
    assert stage_winner([far, near], 0, 1.0) is None


def _shaped(mean: float, deviations: list[float], sd: float) -> list[float]:
    """Values with exactly this mean and sample standard deviation."""
    z = np.asarray(deviations, float)
    z = (z - z.mean()) / z.std(ddof=1)
    return list(mean + sd * z)


@pytest.mark.parametrize("repeats", [1, 2, 4])
@pytest.mark.parametrize("pooled", [True, False])
def test_resolvable_gain_is_the_rules_threshold_for_equally_noisy_sides(
    repeats: int, pooled: bool
) -> None:
    """With the noise known from the baseline alone: the pooled rule's estimate of it, or
    (pair rule) sides as noisy as the baseline."""
    baseline = _shaped(1000.0, [-1, 0, 1], 100.0)  # CV 10 %
    gain = resolvable_gain(baseline, repeats, min_gain=0.0, pooled=pooled)
    assert gain is not None and 0.05 < gain < 0.5
    inc = _shaped(1000.0, list(range(3 + repeats)), 100.0)
    # the first stage's pool: both sides' measurements, as noisy as the baseline's
    sd = NoiseEstimate.of(baseline).rel_sd
    noise = NoiseEstimate(sd, 3 + repeats + 1 + repeats - 2) if pooled else None
    for factor, accepted in ((1.01, True), (0.99, False)):
        cand = _shaped(1000.0 * (1 + factor * gain), list(range(1 + repeats)), 100.0)
        d = decide(Comparison("b", "tok_s", "maximize", inc, cand, True, 0.0, pooled=noise))
        assert d.accepted is accepted


def test_resolvable_gain_grows_with_noise_shrinks_with_repeats_and_respects_min_gain() -> None:
    quiet, noisy = _shaped(1000, [-1, 0, 1], 20), _shaped(1000, [-1, 0, 1], 270)
    assert resolvable_gain(quiet, 2, 0.0) < resolvable_gain(noisy, 2, 0.0)  # type: ignore[operator]
    assert resolvable_gain(noisy, 8, 0.0) < resolvable_gain(noisy, 2, 0.0)  # type: ignore[operator]
    assert resolvable_gain(quiet, 2, 0.25) == 0.25
    assert resolvable_gain([1000.0], 2, 0.0) is None
    assert resolvable_gain([1000.0, float("inf")], 2, 0.0) is None


def test_resolution_line_states_the_spread_and_what_to_raise() -> None:
    line = resolution_line("output_token_rate", _shaped(3000, [-1, 0, 1], 810), 2, 0.02)
    assert "CV 27%" in line and "a gain must exceed ~" in line and "workload.window_s" in line
    assert "unknown" in resolution_line("output_token_rate", [3000.0], 2, 0.02)


def test_the_advice_follows_where_the_baselines_noise_comes_from() -> None:
    """Launches that differ beyond their windows' own slices are not helped by a longer
    window; windows whose own slices explain the spread are."""
    samples = _shaped(3000, [-1, 1], 300)
    apart = [[1000, 1010, 990, 1000], [1200, 1190, 1210, 1200], [900, 910, 890, 900]]
    line = resolution_line("output_throughput", samples, 1, 0.03, slices=apart)
    assert "launches differ" in line and "not the window" in line
    assert "study.repeats" in line and "slices of a window 1% apart" in line
    alike = [[1000, 1300, 800, 1100], [1100, 900, 1250, 950]]
    line = resolution_line("output_throughput", samples, 1, 0.03, slices=alike)
    assert "raise workload.window_s (seconds, not launches)" in line
    assert "launches 0% beyond that" in line
    # A window without slices (no token times, an older stored baseline): the general advice.
    line = resolution_line("output_throughput", samples, 1, 0.03, slices=[[], apart[0]])
    assert "for smaller ones raise workload.window_s" in line and "slices" not in line
    assert noise_advice(None) == noise_advice(NoiseSplit.of([]))


def test_a_decision_made_on_the_slos_does_not_print_a_threshold_it_ignored() -> None:
    """+2 % against a threshold of ~20 % is accepted when the incumbent misses the SLOs and the
    candidate misses them by less: the line says the SLOs decided, not "a gain must exceed"."""
    noisy = Comparison(
        "quantization",
        "output_throughput_per_gpu",
        "maximize",
        [300, 420],
        [360, 370],
        False,
        0.02,
        incumbent_feasible=False,
        incumbent_violation=0.97,
        candidate_violation=0.91,
    )
    d = decide(noisy)
    assert d.accepted and d.on_slos and d.threshold > 0.1 * d.incumbent_mean
    assert "decided on the SLOs, not the gain" in d.line() and "must exceed" not in d.line()
    both = decide(replace(noisy, candidate_feasible=True, incumbent_feasible=True))
    assert not both.on_slos and "a gain must exceed" in both.line()
