"""A stage of a study: one parameter group searched against the incumbent.

The plan (which groups, in which order, or all of them at once for the joint strategy), the
incumbent that enters a stage, and what a finished study returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna

from tuner.acceptance import Decision
from tuner.config import ParamSpec, TunerConfig


@dataclass
class Stage:
    name: str
    specs: dict[str, ParamSpec]


@dataclass
class Incumbent:
    """The best configuration so far: explicit params on top of the fixed args."""

    params: dict[str, Any]
    values: list[float]
    constraints: dict[str, float]
    source: str


@dataclass
class StudyResult:
    baseline: Incumbent
    final: Incumbent
    decisions: list[Decision] = field(default_factory=list)
    pareto: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def plan_stages(config: TunerConfig) -> list[Stage]:
    """Stages in the configured order; the joint strategy is one stage over every group."""
    space = config.search_space
    names = [s for s in config.study.stages if s in space]
    if config.study.strategy == "joint":
        union: dict[str, ParamSpec] = {}
        for name in names:
            union.update(space[name])
        return [Stage("joint", union)] if union else []
    return [Stage(name, space[name]) for name in names]


def incumbent_of(trial: optuna.trial.FrozenTrial, source: str) -> Incumbent:
    return Incumbent({}, list(trial.values), dict(trial.constraints), source)


def spec_text(spec: ParamSpec) -> str:
    if spec.choices is not None:
        return str(list(spec.choices))
    return f"[{spec.low}, {spec.high}]{' log' if spec.log else ''}"
