"""tuner.study.decision.lead: which near miss of a stage leads the next stages, on hand-made
trials."""

from __future__ import annotations

import optuna

from tuner.schema import TrialAttr, TrialStatus
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.lead import (
    LEAD_MAX_OVERSHOOT,
    find_lead,
    lead_incumbent,
    next_lead,
    other_configurations,
)
from tuner.study.decision.noise import NoiseEstimate
from tuner.study.decision.stages import Incumbent

FEASIBLE = Incumbent(
    {"tensor_parallel_size": 8}, [100.0], {"slo_p99_ttft": -0.2}, "baseline", [99.0, 100.0, 101.0]
)


def _trial(number: int, tp: int, value: float, overshoot: float, ok: bool = True):  # type: ignore[no-untyped-def]
    trial = optuna.trial.create_trial(
        params={"tensor_parallel_size": tp},
        distributions={
            "tensor_parallel_size": optuna.distributions.CategoricalDistribution([1, 2, 4, 8])
        },
        values=[value],
        user_attrs={TrialAttr.STATUS: TrialStatus.OK if ok else TrialStatus.FAILED},
        constraints={"slo_p99_ttft": overshoot},
    )
    trial.number = number
    return trial


def _lead(*trials, incumbent: Incumbent = FEASIBLE, noise: float = 0.01):  # type: ignore[no-untyped-def]
    return find_lead(list(trials), incumbent, 0, 1.0, 0.0, NoiseEstimate(noise, 10))


def test_the_best_near_miss_beyond_the_noise_leads() -> None:
    near, nearer = _trial(1, 4, 145.0, 0.09), _trial(2, 2, 130.0, 0.02)
    assert _lead(near, nearer, _trial(3, 1, 300.0, LEAD_MAX_OVERSHOOT + 0.01)) is near
    lead = lead_incumbent(near, FEASIBLE, "parallelism", 0, dict(near.constraints))
    assert lead.params == {"tensor_parallel_size": 4} and lead.samples == [145.0]
    assert lead.constraints == {"slo_p99_ttft": 0.09}
    assert lead.source == "parallelism trial 1 (lead)"


def test_no_lead_without_a_gain_beyond_the_noise_a_feasible_incumbent_or_a_running_server() -> None:
    assert _lead(_trial(1, 4, 101.0, 0.09)) is None  # within 1 % noise over 3 + 1 windows
    assert _lead(_trial(1, 4, 101.0, 0.09), noise=0.0) is not None  # no noise: any gain
    assert _lead(_trial(1, 4, 145.0, 0.0)) is None  # feasible: the acceptance rule's
    assert _lead(_trial(1, 4, 145.0, 0.09, ok=False)) is None  # its server did not run
    over = Incumbent({}, [100.0], {"slo_p99_ttft": 0.3}, "baseline")
    assert _lead(_trial(1, 4, 145.0, 0.09), incumbent=over) is None  # already stepping


def test_a_winner_whose_repeats_missed_the_slos_is_judged_by_them() -> None:
    """Its window read under the SLO (so it won the stage); its repeats read 1 % over it: as a
    passed-over winner it is a near miss, as a window alone it is not."""
    winner = _trial(1, 4, 145.0, -0.001)
    assert _lead(winner) is None
    repeated = {1: {"slo_p99_ttft": 0.01}}
    got = find_lead([winner], FEASIBLE, 0, 1.0, 0.0, NoiseEstimate(0.01, 10), repeated)
    assert got is winner
    assert (
        find_lead(
            [winner],
            FEASIBLE,
            0,
            1.0,
            0.0,
            NoiseEstimate(0.01, 10),
            {1: {"slo_p99_ttft": LEAD_MAX_OVERSHOOT + 0.01}},
        )
        is None
    )


def test_a_winner_kept_out_on_its_repeats_leads_with_or_without_a_runner_up() -> None:
    """No other trial met the SLOs on its window, so no runner-up was confirmed: the kept
    decision's candidate is the winner, judged by its repeats (4 % over), and leads."""
    winner, slower = _trial(1, 4, 145.0, -0.001), _trial(2, 2, 90.0, 0.5)
    kept = Decision(
        "parallelism",
        "tok_s",
        "maximize",
        False,
        "violated an SLO",
        candidate_trial=1,
        candidate_constraints={"slo_p99_ttft": 0.04},
    )
    got = next_lead([winner, slower], FEASIBLE, kept, (0, 1.0), 0.0, NoiseEstimate(0.01, 10))
    assert got is not None
    lead, line = got
    assert lead.params == {"tensor_parallel_size": 4} and lead.constraints == {"slo_p99_ttft": 0.04}
    assert "missed the SLOs by 4.0%" in line
    # Accepted, its constraints are the new incumbent's: nothing re-measured is left over.
    accepted = Decision(
        "parallelism",
        "tok_s",
        "maximize",
        True,
        "gain",
        candidate_trial=1,
        candidate_constraints={"slo_p99_ttft": -0.01},
    )
    assert next_lead([winner], FEASIBLE, accepted, (0, 1.0), 0.0, NoiseEstimate(0.01, 10)) is None


def test_only_another_configuration_than_the_incumbents_can_lead() -> None:
    """The parallelism stage launched the incumbent's own TP 8 again (pipeline parallelism left
    out reads as vLLM's 1): that window read 9 % better and over the SLO, which is noise, not a
    configuration another group's knob could fix."""
    runs = {"tensor_parallel_size": 8, "pipeline_parallel_size": 1}

    def as_run(params: dict[str, object]) -> dict[str, object]:
        return {**runs, **params}

    again, other = _trial(1, 8, 109.0, 0.03), _trial(2, 4, 120.0, 0.05)
    assert other_configurations([again, other], FEASIBLE, as_run) == [other]
    assert _lead(again) is again  # judged alone, its window would lead
    assert _lead(*other_configurations([again], FEASIBLE, as_run)) is None
