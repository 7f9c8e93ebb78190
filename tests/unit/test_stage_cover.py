"""Which points of a stage's finite space are left to measure (tuner.study.decision.stages)."""

from __future__ import annotations

import optuna

from tuner.config import ParamSpec
from tuner.search import space as search_space
from tuner.study.decision.stages import Stage
from tuner.study.state.stored_stage import StoredStage

SPECS = {
    "tensor_parallel_size": ParamSpec(type="categorical", choices=[1, 2, 4, 8]),
    "enforce_eager": ParamSpec(type="bool"),
}


def _study_with(*points: dict[str, object]) -> optuna.Study:
    study = optuna.create_study()
    for point in points:
        study.add_trial(
            optuna.trial.create_trial(
                value=1.0, params=point, distributions=search_space.distributions(SPECS)
            )
        )
    return study


def test_the_points_left_are_those_nobody_measured() -> None:
    stage = Stage("parallelism", SPECS, trials=8)
    study = _study_with({"tensor_parallel_size": 8, "enforce_eager": True})
    left = StoredStage(study, stage).unmeasured(8)
    assert len(left) == 7
    assert {"tensor_parallel_size": 8, "enforce_eager": True} not in left
    assert {"tensor_parallel_size": 8, "enforce_eager": False} in left


def test_more_points_left_than_the_budget_gives_none() -> None:
    stage = Stage("parallelism", SPECS, trials=8)
    study = _study_with({"tensor_parallel_size": 1, "enforce_eager": False})
    assert StoredStage(study, stage).unmeasured(6) == []
    assert len(StoredStage(study, stage).unmeasured(7)) == 7


def test_a_continuous_range_has_no_points_to_list() -> None:
    specs = {"gpu_memory_utilization": ParamSpec(type="float", low=0.8, high=0.95)}
    assert StoredStage(optuna.create_study(), Stage("memory", specs, 4)).unmeasured(100) == []
