"""Fleet objectives (objectives/fleet.py): tok/s per GPU and per user."""

from __future__ import annotations

import math

import pytest

from tests.unit.test_objectives import EMPTY, meas
from tuner.errors import ConfigError
from tuner.scoring.objective import ObjectiveContext, get_objective

PER_GPU = get_objective("output_throughput_per_gpu")
PER_USER = get_objective("output_throughput_per_user")


def test_per_gpu_divides_the_servers_throughput_by_the_gpus_it_occupies() -> None:
    assert PER_GPU.direction == "maximize"
    assert PER_GPU.value(meas(tok_s=8000.0), ObjectiveContext(device="cuda", gpus_used=4)) == 2000
    assert PER_GPU.value(meas(tok_s=8000.0), ObjectiveContext(device="cuda", gpus_used=1)) == 8000


def test_per_gpu_has_no_value_without_traffic_or_gpus_and_refuses_a_cpu_study() -> None:
    assert math.isnan(PER_GPU.value(EMPTY, ObjectiveContext(device="cuda", gpus_used=2)))
    assert math.isnan(PER_GPU.value(meas(), ObjectiveContext(device="cuda", gpus_used=0)))
    with pytest.raises(ConfigError, match="not available"):
        PER_GPU.validate(ObjectiveContext(device="cpu"))


def test_per_user_is_the_inverse_of_the_median_tpot() -> None:
    assert PER_USER.direction == "maximize"
    assert PER_USER.value(meas(tpot=0.02), ObjectiveContext()) == pytest.approx(50.0)
    assert math.isnan(PER_USER.value(meas(tpot=None), ObjectiveContext()))
    assert math.isnan(PER_USER.value(EMPTY, ObjectiveContext()))
