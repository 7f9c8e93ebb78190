"""A study that keeps its baseline where its own plan promised a gain within the SLOs names the
measurement that contradicted the estimate (the flagship 70B rehearsal kept TP 8 bf16 where its
plan estimated FP8 at a smaller TP at about twice the tokens/s per GPU, and could not say why).
The estimates are the real estimator's (AIConfigurator, offline); the trials are stand-ins."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import optuna
import pytest

from tuner.composition import compose
from tuner.plan.planner import Planner
from tuner.schema import TrialAttr, TrialStatus
from tuner.scoring.confidence import SloClaim
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.stages import Incumbent, StudyResult
from tuner.study.loop.promise import (
    against_the_plan,
    contradiction_lines,
    nearest_launch,
    promised,
)

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
NAMES = ["output_throughput_per_gpu"]


@pytest.fixture(scope="module")
def planner() -> Planner:
    config = compose(
        [
            "study=llama70b_8xh200",
            "server.model=meta-llama/Meta-Llama-3.1-70B",
            "search_space=[parallelism,quantization]",
            "study.stages=[quantization,parallelism]",
            "search_space.parallelism.pipeline_parallel_size.choices=[1]",
        ]
    )
    return Planner(config)


def _trial(number: int, params: dict[str, Any], constraints: dict[str, float]) -> Any:
    attrs = {
        TrialAttr.STATUS: TrialStatus.OK,
        TrialAttr.STAGE: "parallelism",
        TrialAttr.PARAMS_ALL: params,
    }
    t = optuna.trial.create_trial(values=[600.0], user_attrs=attrs, constraints=constraints)
    t.number = number
    return t


def test_the_plan_promises_a_smaller_fp8_server_over_the_bf16_node(planner: Planner) -> None:
    config = planner.config
    specs = {p: s for group in config.search_space.values() for p, s in group.items()}
    promise = promised(planner, specs, config.slo, "output_throughput_per_gpu", 0.02)
    assert promise is not None
    best, base = promise.best.estimate, promise.baseline.estimate
    assert best.tokens_s_gpu > 1.3 * base.tokens_s_gpu
    assert promise.best.params.get("tensor_parallel_size", 8) < 8 and promise.best.meets(config.slo)
    # nothing is promised where no point beats the baseline by the gain asked
    assert promised(planner, specs, config.slo, "output_throughput_per_gpu", 10.0) is None


def test_the_summary_names_the_launch_that_contradicted_the_estimate(planner: Planner) -> None:
    config = planner.config
    specs = {p: s for group in config.search_space.values() for p, s in group.items()}
    promise = promised(planner, specs, config.slo, "output_throughput_per_gpu", 0.02)
    assert promise is not None
    point = dict(promise.best.params)
    far = _trial(3, {"tensor_parallel_size": 8}, {"slo_p99_ttft": -0.2})
    there = _trial(5, point, {"slo_p99_ttft": 0.12, "slo_p99_tpot": -0.1})
    assert nearest_launch(point, [far, there]) is there
    base = Incumbent({}, [353.0], {}, "baseline", [353.0])
    lines = contradiction_lines(promise, [far, there], StudyResult(base, base), NAMES)
    assert lines[0].startswith(f"  the plan estimated {point} at ")
    assert lines[1] == (
        "    the study measured that point (parallelism trial 5): slo_p99_ttft over by 12%: "
        "that measurement contradicts the estimate"
    )
    # a study that handed over the promised point says nothing of the plan
    new = Incumbent(point, [700.0], {}, "parallelism trial 5", [700.0])
    assert contradiction_lines(promise, [there], StudyResult(base, new), NAMES) == []
    # one that handed over another point names the measurement of the promised one
    other = Incumbent({"tensor_parallel_size": 8}, [380.0], {}, "quantization trial 1", [380.0])
    shown = contradiction_lines(promise, [far, there], StudyResult(base, other), NAMES)
    assert shown[0].endswith("the study handed over {'tensor_parallel_size': 8} instead:")
    assert shown[1] == lines[1]
    # no launch near it: said so
    assert "no launch" in contradiction_lines(promise, [], StudyResult(base, base), NAMES)[-1]


def test_a_winner_on_the_way_that_its_repeats_kept_out_is_named(planner: Planner) -> None:
    """The flagship rehearsal: the quantization stage's FP8 winner read 1 % over the TTFT limit
    on the mean of its repeats, undecided, so the stage kept bf16 and the parallelism stage
    never searched FP8 at a smaller TP. The summary names those repeats, not only the nearest
    launch's own window."""
    config = planner.config
    specs = {p: s for group in config.search_space.values() for p, s in group.items()}
    promise = promised(planner, specs, config.slo, "output_throughput_per_gpu", 0.02)
    assert promise is not None
    point = dict(promise.best.params)
    step = {"quantization": point["quantization"]}
    near = _trial(1, step, {"slo_p99_ttft": -0.1})
    claim = SloClaim("slo_p99_ttft", 0.01, 0.08, 0.45, 0.9, 5, 0.17, 8)
    decision = Decision("quantization", "output_throughput_per_gpu", "maximize", False, "")
    kept_out = replace(decision, candidate_trial=1, candidate_params=step, candidate_slos=[claim])
    base = Incumbent({}, [353.0], {}, "baseline", [353.0])
    lines = contradiction_lines(promise, [near], StudyResult(base, base, [kept_out]), NAMES)
    assert "met the SLOs in its window but read" in lines[1]
    assert lines[2] == (
        f"    the quantization stage's winner {step} (trial 1), a step toward that point: its "
        f"repeats read {claim.text()}; the stage kept its incumbent, so no later stage searched "
        "from it"
    )
    # a winner whose repeats met every SLO, or one that leads elsewhere, is not named
    met = replace(claim, mean=-0.2, bound=-0.1, confidence=0.99)
    for other in (replace(kept_out, candidate_slos=[met]), replace(kept_out, candidate_params={})):
        shown = contradiction_lines(promise, [near], StudyResult(base, base, [other]), NAMES)
        assert len(shown) == 2


def test_a_hand_over_at_the_baselines_tp_still_names_what_contradicted_the_plan(
    planner: Planner,
) -> None:
    """The flagship rehearsal with the prescreen: its memory stage handed over the baseline's
    TP 8 at another memory setting (accepted on the SLOs alone, -0.2 %), against a plan that
    promised FP8 at a smaller TP. Not keeping the baseline must not silence the plan's line."""
    config = planner.config
    specs = {p: s for group in config.search_space.values() for p, s in group.items()}
    promise = promised(planner, specs, config.slo, "output_throughput_per_gpu", 0.02)
    assert promise is not None
    there = _trial(5, dict(promise.best.params), {"slo_p99_ttft": 0.12})
    base = Incumbent({}, [341.3], {}, "baseline", [341.3])
    step = Incumbent({"tensor_parallel_size": 8}, [340.8], {}, "memory trial 0", [340.8])
    select, gain = "output_throughput_per_gpu", config.study.min_gain
    lines = against_the_plan(
        planner, specs, config.slo, select, gain, [there], StudyResult(base, step), NAMES
    )
    assert lines[0].endswith("the study handed over {'tensor_parallel_size': 8} instead:")
    assert "that measurement contradicts the estimate" in lines[1]
    handed = Incumbent(dict(promise.best.params), [690.0], {}, "parallelism trial 5", [690.0])
    done = StudyResult(base, handed)
    shown = against_the_plan(planner, specs, config.slo, select, gain, [there], done, NAMES)
    assert shown == []
