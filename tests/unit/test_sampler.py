"""Samplers by name: each runs a constrained 2-objective study; grid enumerates; TPE learns."""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial

from tuner.config import ParamSpec, SamplerConfig
from tuner.errors import ConfigError
from tuner.scoring.objective import NO_DATA_VIOLATION
from tuner.search import space as ss
from tuner.search.samplers import grid_size, grid_values, known_samplers, make_sampler

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = {
    "x": ParamSpec(type="int", low=1, high=5, step=1),
    "quant": ParamSpec(type="categorical", choices=["none", "fp8", "int8", "awq"]),
}
BAD = "fp8"  # the choice whose server "never starts"
OPTIONS = {"nsga2": {"population_size": 4}}


def _tell(study: optuna.Study, trial: optuna.Trial, params: dict[str, Any]) -> None:
    """What the study does: a failure is COMPLETE-but-infeasible with the worst values."""
    if params["quant"] == BAD:
        trial.set_constraint("error_rate", NO_DATA_VIOLATION)
        study.tell(trial, [math.inf, -math.inf])
        return
    trial.set_constraint("error_rate", -0.01)
    x = params["x"]
    study.tell(trial, [0.1 * x, 100.0 * x])  # latency and throughput both grow with x


def _run(sampler: optuna.samplers.BaseSampler, n: int) -> optuna.Study:
    study = optuna.create_study(directions=["minimize", "maximize"], sampler=sampler)
    for _ in range(n):
        trial = study.ask()
        _tell(study, trial, ss.suggest(trial, SPACE))
    return study


def test_the_known_samplers() -> None:
    assert known_samplers() == ["gp", "grid", "nsga2", "random", "tpe"]


@pytest.mark.parametrize("name", ["tpe", "gp", "nsga2", "random", "grid"])
def test_each_sampler_runs_a_constrained_two_objective_study(name: str) -> None:
    config = SamplerConfig(name=name, n_startup_trials=2, options=OPTIONS.get(name, {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = _run(make_sampler(config, SPACE, seed=3), 5)
    done = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert len(done) == 5
    assert all(t.params.keys() == SPACE.keys() for t in done)
    assert all(set(t.constraints) == {"error_rate"} for t in done)


def test_constraints_func_is_still_passed_through() -> None:
    def constraints(trial: FrozenTrial) -> Sequence[float]:
        return [1.0 if trial.params["quant"] == BAD else -1.0]

    sampler = make_sampler(SamplerConfig(name="tpe"), SPACE, seed=0, constraints_func=constraints)
    study = optuna.create_study(directions=["minimize", "maximize"], sampler=sampler)
    study.optimize(lambda t: (float(ss.suggest(t, SPACE)["x"]), 1.0), n_trials=4)
    assert all(list(t.constraints.values()) in ([1.0], [-1.0]) for t in study.trials)


def test_unknown_sampler_and_bad_option_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"sampler.name='cmaes' is unknown \(known: gp, grid"):
        make_sampler(SamplerConfig(name="cmaes"), SPACE, seed=0)
    with pytest.raises(ConfigError, match=r"sampler\.options for 'tpe' rejected"):
        make_sampler(SamplerConfig(name="tpe", options={"n_ei_candidate": 3}), SPACE, seed=0)


def test_grid_enumerates_every_combination_once_with_ask_and_tell() -> None:
    config = SamplerConfig(name="grid")
    assert grid_size(config, SPACE) == 20
    study = _run(make_sampler(config, SPACE, seed=0), 20)  # Optuna's own would raise at #20
    seen = [(t.params["x"], t.params["quant"]) for t in study.trials]
    assert sorted(seen) == sorted(itertools.product(range(1, 6), SPACE["quant"].choices or []))


def test_grid_needs_steps_or_explicit_values() -> None:
    space = {"max_num_seqs": ParamSpec(type="int", low=4, high=256, log=True)}
    with pytest.raises(ConfigError, match=r"sampler=grid: .*max_num_seqs.*needs a step"):
        make_sampler(SamplerConfig(name="grid"), space, seed=0)
    config = SamplerConfig(name="grid", options={"values": {"max_num_seqs": [8, 64]}})
    assert grid_values(config, space) == {"max_num_seqs": [8, 64]}
    make_sampler(config, space, seed=0)
    with pytest.raises(ConfigError, match="not in this stage"):
        grid_values(SamplerConfig(name="grid", options={"values": {"nope": [1]}}), space)


def _later_bad_share(study: optuna.Study) -> float:
    later = [t.params["quant"] for t in study.trials[20:]]
    return later.count(BAD) / len(later)


def test_tpe_learns_to_avoid_an_infeasible_choice() -> None:
    """1 of 4 choices always fails: after 20 trials TPE picks it in < 25 % of the next 20."""
    config = SamplerConfig(name="tpe", n_startup_trials=5)
    shares = [_later_bad_share(_run(make_sampler(config, SPACE, seed=s), 40)) for s in range(4)]
    assert sum(shares) / len(shares) < 0.25, shares


def test_a_failure_told_as_fail_attracts_tpe_instead() -> None:
    """Why failures are told COMPLETE-but-infeasible: TPE ignores FAIL trials, so the failing
    choice looks unexplored and wins the l(x)/g(x) ratio again and again."""
    study = optuna.create_study(
        directions=["minimize", "maximize"],
        sampler=make_sampler(SamplerConfig(name="tpe", n_startup_trials=5), SPACE, seed=0),
    )
    for _ in range(40):
        trial = study.ask()
        params = ss.suggest(trial, SPACE)
        if params["quant"] == BAD:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            _tell(study, trial, params)
    assert _later_bad_share(study) > 0.5


def test_gp_without_its_dependencies_fails_at_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a)
    )
    with pytest.raises(ConfigError) as err:
        make_sampler(SamplerConfig(name="gp"), SPACE, seed=0)
    assert err.value.one_line() == (
        "sampler=gp needs scipy, which is not installed (pip install scipy, or use sampler=tpe)"
    )
