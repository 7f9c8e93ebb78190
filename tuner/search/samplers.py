"""Optuna samplers by registered name (``sampler.name`` in the config).

Every factory receives the :class:`~tuner.config.SamplerConfig`, the stage's parameter specs,
a seed and an optional ``constraints_func``. ``sampler.options`` are passed to the Optuna
constructor as keyword arguments, so any option Optuna has can be set from YAML; a wrong one is a
ConfigError naming ``sampler.options``.

Constraints in Optuna 5: TPE, GP and NSGA-II read a trial's constraints from its storage
(``trial.set_constraint(name, violation)``, or ``constraints`` in ``create_trial``), whether or
not a ``constraints_func`` was given; ``constraints_func`` still works but is deprecated in 5.0
(FutureWarning, removal planned for 7.0). Pass None and set the constraints on the trial unless
the calling code only has a FrozenTrial-based function. Random and grid sampling ignore
constraints (they do not learn).

Tell a failed server start as COMPLETE with its constraints violated (and the worst values),
not as FAIL: the samplers skip FAIL trials, and TPE then rates the failing region as unexplored
and proposes it again and again (tests/unit/test_sampler.py measures both).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.samplers import (
    BaseSampler,
    GPSampler,
    GridSampler,
    NSGAIISampler,
    RandomSampler,
    TPESampler,
)
from optuna.trial import FrozenTrial, TrialState

from tuner.config import SamplerConfig
from tuner.errors import ConfigError
from tuner.search import space as search_space
from tuner.search.space import SpecLike

ConstraintsFunc = Callable[[FrozenTrial], Sequence[float]]
SamplerFactory = Callable[
    [SamplerConfig, Mapping[str, SpecLike], int, ConstraintsFunc | None], BaseSampler
]
# sampler.options keys that tuner consumes itself instead of passing them to Optuna.
GRID_VALUES_OPTION = "values"
# Optuna imports these lazily, at the first GP fit; checking at set-up fails before any trial.
GP_MODULES = ("scipy", "torch")

SAMPLERS: dict[str, SamplerFactory] = {}


def register_sampler(name: str) -> Callable[[SamplerFactory], SamplerFactory]:
    """Register a factory under ``name``; usable as a decorator."""

    def wrap(factory: SamplerFactory) -> SamplerFactory:
        SAMPLERS[name] = factory
        return factory

    return wrap


def known_samplers() -> list[str]:
    return sorted(SAMPLERS)


def make_sampler(
    config: SamplerConfig,
    space: Mapping[str, SpecLike],
    seed: int,
    constraints_func: ConstraintsFunc | None = None,
    parallel: bool = False,
) -> BaseSampler:
    """The Optuna sampler named by ``config.name`` for one stage's parameter specs;
    ``parallel``: it proposes while other trials of the stage still run."""
    try:
        factory = SAMPLERS[config.name]
    except KeyError:
        raise ConfigError(
            f"sampler.name={config.name!r} is unknown (known: {', '.join(known_samplers())})",
            hint="pick one with sampler=<name>",
        ) from None
    if parallel:
        config = for_parallel(config)
    return factory(config, space, seed, constraints_func)


# Options for proposals made while other trials run. TPE's constant liar counts a running trial
# as a bad result, so that N proposals asked at once spread out instead of landing on the same
# promising point N times (Optuna 5 turns it on by default; named here so that a parallel study
# keeps it whatever the default becomes). GP needs none: Optuna's GPSampler conditions on the
# running trials itself (q-batch acquisition). NSGA-II breeds generations and has no such
# option; grid and random proposals do not depend on results.
PARALLEL_OPTIONS: dict[str, dict[str, Any]] = {"tpe": {"constant_liar": True}}


def for_parallel(config: SamplerConfig) -> SamplerConfig:
    """``config`` with its parallel options; an option the user set wins."""
    extra = PARALLEL_OPTIONS.get(config.name, {})
    options = {**extra, **config.options}
    return SamplerConfig(config.name, config.n_startup_trials, options)


def _build(cls: type[BaseSampler], config: SamplerConfig, **kwargs: Any) -> BaseSampler:
    """``cls(**kwargs, **options)``, with a bad option reported as a config error."""
    options = {k: v for k, v in config.options.items() if k != GRID_VALUES_OPTION}
    try:
        with warnings.catch_warnings():
            # Our own use of the deprecated constraints_func is documented above; a caller
            # that passes one has chosen it. Other warnings still reach the user.
            warnings.filterwarnings(
                "ignore", message=".*constraints_func.*", category=FutureWarning
            )
            return cls(**{**kwargs, **options})
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"sampler.options for {config.name!r} rejected by optuna.{cls.__name__}: {exc}",
            hint=f"see optuna {optuna.__version__} docs for {cls.__name__}",
        ) from exc


@register_sampler("tpe")
def _tpe(
    config: SamplerConfig,
    space: Mapping[str, SpecLike],
    seed: int,
    constraints_func: ConstraintsFunc | None,
) -> BaseSampler:
    # multivariate: vLLM knobs interact (max_num_seqs x max_num_batched_tokens), and the
    # independent TPE cannot model that.
    return _build(
        TPESampler,
        config,
        multivariate=True,
        n_startup_trials=config.n_startup_trials,
        seed=seed,
        constraints_func=constraints_func,
    )


@register_sampler("gp")
def _gp(
    config: SamplerConfig,
    space: Mapping[str, SpecLike],
    seed: int,
    constraints_func: ConstraintsFunc | None,
) -> BaseSampler:
    missing = [m for m in GP_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"sampler=gp needs {', '.join(missing)}, which is not installed",
            hint=f"pip install {' '.join(missing)}, or use sampler=tpe",
        )
    return _build(
        GPSampler,
        config,
        n_startup_trials=config.n_startup_trials,
        seed=seed,
        constraints_func=constraints_func,
    )


@register_sampler("nsga2")
def _nsga2(
    config: SamplerConfig,
    space: Mapping[str, SpecLike],
    seed: int,
    constraints_func: ConstraintsFunc | None,
) -> BaseSampler:
    # population_size comes from sampler.options (Optuna's default of 50 is more trials than
    # a stage usually has, which would make NSGA-II pure random search).
    return _build(NSGAIISampler, config, seed=seed, constraints_func=constraints_func)


@register_sampler("random")
def _random(
    config: SamplerConfig,
    space: Mapping[str, SpecLike],
    seed: int,
    constraints_func: ConstraintsFunc | None,
) -> BaseSampler:
    return _build(RandomSampler, config, seed=seed)


def grid_values(config: SamplerConfig, space: Mapping[str, SpecLike]) -> dict[str, list[Any]]:
    """Every grid point per parameter: ``sampler.options.values.<param>`` or the spec's grid."""
    explicit = dict(config.options.get(GRID_VALUES_OPTION) or {})
    stray = sorted(set(explicit) - set(space))
    if stray:
        raise ConfigError(
            f"sampler.options.values names parameters not in this stage: {stray}",
            hint=f"this stage tunes {sorted(space)}",
        )
    rest = {p: s for p, s in space.items() if p not in explicit}
    return {**{p: list(v) for p, v in explicit.items()}, **search_space.grid(rest)}


def grid_size(config: SamplerConfig, space: Mapping[str, SpecLike]) -> int:
    """How many trials cover the grid (size the stage's trial budget with it)."""
    return math.prod(len(v) for v in grid_values(config, space).values())


class AskTellGridSampler(GridSampler):
    """GridSampler for ask/tell loops.

    Optuna's GridSampler calls ``study.stop()`` after the last grid point, which raises
    RuntimeError outside ``study.optimize`` (after storing the trial). Here the study's own
    trial budget ends a stage; once the grid is exhausted Optuna re-evaluates visited points.
    """

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        return None


@register_sampler("grid")
def _grid(
    config: SamplerConfig,
    space: Mapping[str, SpecLike],
    seed: int,
    constraints_func: ConstraintsFunc | None,
) -> BaseSampler:
    try:
        return AskTellGridSampler(grid_values(config, space), seed=seed)
    except ConfigError as exc:
        raise ConfigError(
            f"sampler=grid: {exc.message}",
            hint="give the range a step, make it categorical, or list its values in "
            "sampler.options.values.<param>",
        ) from exc
