"""Parameter specs (data, from conf/search_space/) → validated groups, Optuna distributions,
launches.

A search space is ``{group: {param: ParamSpec}}``; a group is one stage of a staged study. Each
spec says its type (a registered :data:`KINDS` entry), its range or choices, and where its value
goes (:data:`TARGETS`: a vLLM argument or an environment variable). Values that mean "leave it
out" (``omit``) and environment variables that a choice needs (``env_by_choice``) are declared
in the spec too, so no parameter is special-cased in code.

OmegaConf does not type the inner level of ``dict[str, dict[str, ParamSpec]]``: the composed
config can hold plain dicts there, with unknown keys unchecked. :func:`coerce_space` turns either
form into checked ParamSpecs; every function here accepts both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.config import ParamSpec, ServerConfig, param_spec
from tuner.errors import ConfigError
from tuner.search.launch import LaunchSpec

SpecLike = ParamSpec | Mapping[str, Any]
Space = dict[str, dict[str, ParamSpec]]
# Types Optuna can store as categorical choices (it persists them as JSON).
CHOICE_TYPES = (bool, int, float, str)


def _fail(where: str, what: str, hint: str | None = None) -> ConfigError:
    return ConfigError(f"search_space.{where}: {what}", hint=hint)


def _omit(spec: ParamSpec) -> list[Any]:
    return list(spec.omit or [])


def _env_by_choice(spec: ParamSpec) -> dict[str, dict[str, str]]:
    raw = spec.env_by_choice or {}
    return {_choice_key(k): {str(n): str(v) for n, v in env.items()} for k, env in raw.items()}


def _choice_key(value: Any) -> str:
    """How a choice is spelled as a YAML key: true/false for bools (as YAML writes them)."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


# ---- specs from YAML ----------------------------------------------------------------------


def as_spec(raw: SpecLike, where: str) -> ParamSpec:
    """A ParamSpec from a spec or a plain mapping; unknown keys are a ConfigError."""
    return param_spec(raw, where)


def coerce_space(raw: Mapping[str, Mapping[str, SpecLike]]) -> Space:
    """The whole search space as checked ParamSpecs (ConfigError on the first problem)."""
    space = {
        str(group): {str(p): as_spec(s, f"{group}.{p}") for p, s in (params or {}).items()}
        for group, params in raw.items()
    }
    validate_space(space)
    return space


# ---- kinds: one entry per `type` ----------------------------------------------------------


@dataclass(frozen=True)
class RangeKind:
    """int / float: a range with optional log scale or step."""

    integral: bool

    def check(self, spec: ParamSpec, where: str) -> None:
        if spec.choices is not None:
            raise _fail(where, f"type {spec.type} takes low/high, not choices", "use categorical")
        if spec.low is None or spec.high is None:
            raise _fail(where, f"type {spec.type} needs both low and high")
        if not spec.low < spec.high:
            raise _fail(where, f"low ({spec.low}) must be < high ({spec.high})")
        if spec.log and spec.low <= 0:
            raise _fail(where, f"log scale needs low > 0, got {spec.low}")
        if spec.log and spec.step is not None:
            raise _fail(where, "log and step cannot be combined (Optuna takes one or the other)")
        if spec.step is not None and spec.step <= 0:
            raise _fail(where, f"step must be > 0, got {spec.step}")
        if self.integral:
            _check_integral(spec, where)

    def distribution(self, spec: ParamSpec) -> BaseDistribution:
        low, high = float(spec.low or 0), float(spec.high or 0)
        if self.integral:
            step = 1 if spec.log else int(spec.step or 1)
            return IntDistribution(int(low), int(high), log=spec.log, step=step)
        return FloatDistribution(low, high, log=spec.log, step=spec.step)

    def suggest(self, trial: optuna.Trial, name: str, spec: ParamSpec) -> Any:
        d: Any = self.distribution(spec)
        ask: Any = trial.suggest_int if self.integral else trial.suggest_float
        return ask(name, d.low, d.high, step=d.step, log=d.log)

    def choices(self, spec: ParamSpec) -> list[Any] | None:
        return None  # not a finite set

    def coerce(self, spec: ParamSpec, value: Any) -> Any:
        """``value`` (maybe an env string) as a point of this range, or None if outside."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(number):
            return None
        if self.integral:
            number = int(number) if number == int(number) else math.nan
        ok = self.distribution(spec)._contains(number)
        return number if ok else None

    def grid(self, spec: ParamSpec, where: str) -> list[Any]:
        if spec.step is None:
            raise _fail(where, "the grid sampler needs a step for a range", "add step: or choices")
        low, step = float(spec.low or 0), float(spec.step)
        count = math.floor((float(spec.high or 0) - low) / step + 1e-9) + 1
        values = [low + i * step for i in range(count)]
        # Rounded so that 0.7 + 3 * 0.05 is stored as 0.85, the value a user would write.
        return [int(v) for v in values] if self.integral else [round(v, 10) for v in values]


@dataclass(frozen=True)
class ChoiceKind:
    """categorical (choices from the spec) / bool (fixed choices, no `choices` key)."""

    fixed: tuple[Any, ...] = ()

    def check(self, spec: ParamSpec, where: str) -> None:
        if spec.low is not None or spec.high is not None:
            raise _fail(where, f"type {spec.type} takes no low/high")
        if self.fixed and spec.choices is not None:
            raise _fail(where, f"type {spec.type} takes no choices", "use categorical for a subset")
        if not self.fixed:
            _check_choices(list(spec.choices or []), where)

    def distribution(self, spec: ParamSpec) -> BaseDistribution:
        return CategoricalDistribution(self.choices(spec))

    def suggest(self, trial: optuna.Trial, name: str, spec: ParamSpec) -> Any:
        return trial.suggest_categorical(name, self.choices(spec))

    def choices(self, spec: ParamSpec) -> list[Any]:
        return list(self.fixed or spec.choices or [])

    def coerce(self, spec: ParamSpec, value: Any) -> Any:
        """The choice ``value`` stands for (``1`` and ``"1"`` alike), or None if none."""
        key = _choice_key(value)
        return next((c for c in self.choices(spec) if key in (_choice_key(c), str(c))), None)

    def grid(self, spec: ParamSpec, where: str) -> list[Any]:
        return self.choices(spec)


def _check_integral(spec: ParamSpec, where: str) -> None:
    for key in ("low", "high", "step"):
        value = getattr(spec, key)
        if value is not None and float(value) != int(value):
            raise _fail(where, f"{key} must be an integer for type int, got {value}")
    step = int(spec.step or 1)
    if (int(spec.high or 0) - int(spec.low or 0)) % step:
        raise _fail(where, f"high - low must be a multiple of step {step}")


def _check_choices(choices: list[Any], where: str) -> None:
    if not choices:
        raise _fail(where, "choices is empty", "list at least one value")
    if any(c is None for c in choices):
        raise _fail(where, "null is not a choice", 'use a string like "none" with omit: [none]')
    bad = [c for c in choices if not isinstance(c, CHOICE_TYPES)]
    if bad:
        raise _fail(where, f"choices must be strings, numbers or booleans, got {bad}")
    if len({_choice_key(c) for c in choices}) != len(choices):
        raise _fail(where, f"choices has duplicates: {choices}")


Kind = RangeKind | ChoiceKind
KINDS: dict[str, Kind] = {
    "int": RangeKind(integral=True),
    "float": RangeKind(integral=False),
    "categorical": ChoiceKind(),
    "bool": ChoiceKind(fixed=(False, True)),
}


def _kind(spec: ParamSpec, where: str) -> Kind:
    try:
        return KINDS[spec.type]
    except KeyError:
        raise _fail(where, f"type {spec.type!r} is unknown (known: {', '.join(KINDS)})") from None


# ---- validation ---------------------------------------------------------------------------


def _check_target(param: str, spec: ParamSpec, where: str) -> None:
    if spec.target not in TARGETS:
        raise _fail(where, f"target {spec.target!r} is unknown (known: {', '.join(TARGETS)})")
    if spec.target == "env" and not spec.name:
        hint = f"e.g. name: {param.upper()}"
        raise _fail(where, "an env parameter needs `name` (the variable to set)", hint)


def _check_extras(spec: ParamSpec, where: str) -> None:
    choices = _kind(spec, where).choices(spec)
    if choices is None:
        return  # a range: any value may be omitted or carry env
    allowed = {_choice_key(c) for c in choices}
    for label, keys in (
        ("omit", [_choice_key(v) for v in _omit(spec)]),
        ("env_by_choice", list(_env_by_choice(spec))),
    ):
        stray = [k for k in keys if k not in allowed]
        if stray:
            raise _fail(where, f"{label} names values that are not choices: {stray}")


def validate_param(group: str, param: str, spec: ParamSpec) -> None:
    where = f"{group}.{param}"
    _kind(spec, where).check(spec, where)
    _check_target(param, spec, where)
    _check_extras(spec, where)


def validate_group(group: str, specs: Mapping[str, SpecLike]) -> None:
    """Check one group's specs; ConfigError names ``search_space.<group>.<param>``."""
    if not specs:
        raise ConfigError(f"search_space.{group} has no parameters", hint="remove it or add one")
    for param, raw in specs.items():
        validate_param(group, param, as_spec(raw, f"{group}.{param}"))


def validate_space(space: Mapping[str, Mapping[str, SpecLike]]) -> None:
    """Check every group, and that no parameter is tuned by two groups (stages would fight)."""
    seen: dict[str, str] = {}
    for group, specs in space.items():
        validate_group(group, specs)
        for param in specs:
            if param in seen:
                raise _fail(f"{group}.{param}", f"is also in group {seen[param]!r}")
            seen[param] = group


# ---- Optuna -------------------------------------------------------------------------------


def _specs(specs: Mapping[str, SpecLike], group: str = "_") -> dict[str, ParamSpec]:
    return {p: as_spec(s, f"{group}.{p}") for p, s in specs.items()}


def distributions(group_specs: Mapping[str, SpecLike]) -> dict[str, BaseDistribution]:
    """Optuna distributions of one group, keyed by parameter name."""
    return {p: _kind(s, p).distribution(s) for p, s in _specs(group_specs).items()}


def grid(group_specs: Mapping[str, SpecLike]) -> dict[str, list[Any]]:
    """Every value of every parameter, for the grid sampler (ranges need a step)."""
    return {p: _kind(s, p).grid(s, p) for p, s in _specs(group_specs).items()}


def suggest(trial: optuna.Trial, specs: Mapping[str, SpecLike]) -> dict[str, Any]:
    """Ask ``trial`` for a value of every parameter of one group (public suggest_* API)."""
    return {p: _kind(s, p).suggest(trial, p, s) for p, s in _specs(specs).items()}


@dataclass(frozen=True)
class Suggestion:
    """One group's point as the sampler asked it, on top of the configuration it starts from,
    and the launch they make together."""

    point: dict[str, Any]  # the group's own params: what the stage's sampler sees
    params: dict[str, Any]  # the whole configuration: the start's params, the point on top
    launch: LaunchSpec


def suggest_launch(
    trial: optuna.Trial,
    specs: Mapping[str, SpecLike],
    start: Mapping[str, Any],
    all_specs: Mapping[str, SpecLike],
) -> Suggestion:
    """Ask ``trial`` for a point of the group ``specs`` and turn it at once, on top of
    ``start``, into the launch it makes (``all_specs``: how every param of the study
    launches), so the point is a launch from where it is asked."""
    point = suggest(trial, specs)
    params = {**start, **point}
    return Suggestion(point, params, to_launch(params, all_specs))


# ---- params → launch ----------------------------------------------------------------------


def _env_value(value: Any) -> str:
    # vLLM reads boolean env vars as "1"/"0" (bool(int(...))), not "True"/"False".
    return str(int(value)) if isinstance(value, bool) else str(value)


def _to_arg(launch: LaunchSpec, param: str, spec: ParamSpec, value: Any) -> None:
    launch.args[spec.name or param] = value


def _to_env(launch: LaunchSpec, param: str, spec: ParamSpec, value: Any) -> None:
    if value is not None:  # an omitted env value leaves the variable as configured
        launch.env[spec.name or param] = _env_value(value)


TARGETS: dict[str, Callable[[LaunchSpec, str, ParamSpec, Any], None]] = {
    "arg": _to_arg,
    "env": _to_env,
}


def to_launch(params: Mapping[str, Any], specs_by_param: Mapping[str, SpecLike]) -> LaunchSpec:
    """Split trial params into vLLM args and env vars, as their specs declare.

    An ``omit`` value becomes None (the server leaves the flag out, overriding a fixed arg);
    ``env_by_choice`` adds the variables a chosen value needs.
    """
    launch = LaunchSpec()
    for param, value in params.items():
        if param not in specs_by_param:
            raise ConfigError(
                f"parameter {param!r} has no spec in search_space",
                hint="the study's stored params and conf/search_space disagree",
            )
        spec = as_spec(specs_by_param[param], param)
        kept = None if any(_choice_key(value) == _choice_key(o) for o in _omit(spec)) else value
        TARGETS[spec.target](launch, param, spec, kept)
        launch.env.update(_env_by_choice(spec).get(_choice_key(value), {}))
    return launch


# ---- whole-space helpers ------------------------------------------------------------------


def flatten(space: Mapping[str, Mapping[str, SpecLike]]) -> dict[str, ParamSpec]:
    """{param: spec} over every group (parameter names are unique across groups)."""
    return {p: as_spec(s, f"{g}.{p}") for g, specs in space.items() for p, s in specs.items()}


def choices_of(spec: SpecLike) -> list[Any] | None:
    """Every value a categorical or bool param can take; None for a range."""
    checked = as_spec(spec, "_")
    return _kind(checked, "_").choices(checked)


def finite_size(specs: Mapping[str, SpecLike]) -> int | None:
    """How many points a group's space has, or None when a param is a continuous range."""
    size = 1
    for param, spec in _specs(specs).items():
        choices = _kind(spec, param).choices(spec)
        if choices is None:
            return None
        size *= len(choices)
    return size


_UNKNOWN = object()


def _effective(
    param: str,
    spec: ParamSpec,
    params: Mapping[str, Any],
    fixed: ServerConfig,
    defaults: Mapping[str, Any],
) -> Any:
    if param in params:
        return params[param]
    where: Mapping[str, Any] = fixed.env if spec.target == "env" else fixed.args
    if (spec.name or param) in where:
        return where[spec.name or param]
    # An omit value means "leave the flag out", i.e. it stands for the server's own default.
    if spec.omit:
        return spec.omit[0]
    return defaults.get(param, _UNKNOWN)


def as_run(
    params: Mapping[str, Any],
    specs: Mapping[str, SpecLike],
    fixed: ServerConfig,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Every parameter of ``specs`` as a server launched with ``params`` runs it, or None.

    A value comes from ``params``, else from the fixed ``fixed.args``/``fixed.env`` (a
    ServerConfig), else from the spec's ``omit`` value, else from ``defaults`` (what the
    server's own config says it runs for a flag left out). None when one is unknown (vLLM
    picks it at start-up) or is not a point of its distribution: the sampler cannot place it.
    """
    out: dict[str, Any] = {}
    for param, spec in _specs(specs).items():
        value = _effective(param, spec, params, fixed, defaults or {})
        point = None if value is _UNKNOWN else _kind(spec, param).coerce(spec, value)
        if point is None:
            return None
        out[param] = point
    return out
