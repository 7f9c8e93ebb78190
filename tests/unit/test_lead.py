"""tuner.study.lead: which near miss of a stage leads the next stages, on hand-made trials."""

from __future__ import annotations

import optuna

from tuner.schema import TrialAttr, TrialStatus
from tuner.study.lead import LEAD_MAX_OVERSHOOT, find_lead, lead_incumbent
from tuner.study.noise import NoiseEstimate
from tuner.study.stages import Incumbent

FEASIBLE = Incumbent({"tensor_parallel_size": 8}, [100.0], {"slo_p99_ttft": -0.2}, "baseline",
                     [99.0, 100.0, 101.0])  # fmt: skip


def _trial(number: int, tp: int, value: float, overshoot: float, ok: bool = True):  # type: ignore[no-untyped-def]
    trial = optuna.trial.create_trial(
        params={"tensor_parallel_size": tp},
        distributions={"tensor_parallel_size": optuna.distributions.CategoricalDistribution(
            [1, 2, 4, 8])},
        values=[value],
        user_attrs={TrialAttr.STATUS: TrialStatus.OK if ok else TrialStatus.FAILED},
        constraints={"slo_p99_ttft": overshoot},
    )  # fmt: skip
    trial.number = number
    return trial


def _lead(*trials, incumbent: Incumbent = FEASIBLE, noise: float = 0.01):  # type: ignore[no-untyped-def]
    return find_lead(list(trials), incumbent, 0, 1.0, 0.0, NoiseEstimate(noise, 10))


def test_the_best_near_miss_beyond_the_noise_leads() -> None:
    near, nearer = _trial(1, 4, 145.0, 0.09), _trial(2, 2, 130.0, 0.02)
    assert _lead(near, nearer, _trial(3, 1, 300.0, LEAD_MAX_OVERSHOOT + 0.01)) is near
    lead = lead_incumbent(near, FEASIBLE, "parallelism", 0)
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
