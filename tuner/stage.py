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
    trials: int  # search trials of this stage (the incumbent seed and confirmations aside)


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


REFINE = "refine"


def plan_stages(config: TunerConfig) -> list[Stage]:
    """Stages in the configured order; the joint strategy is one stage over every group.

    A staged study with ``refine_trials`` ends with a joint stage over every group, started
    from the staged incumbent: staging fixes each group at its winner while later groups are
    searched, which misses optima where parameters of two groups interact.
    """
    cfg, space = config.study, config.search_space
    names = [s for s in cfg.stages if s in space]
    union: dict[str, ParamSpec] = {p: spec for name in names for p, spec in space[name].items()}
    if cfg.strategy == "joint":
        return [Stage("joint", union, cfg.trials_per_stage)] if union else []
    stages = [Stage(name, space[name], cfg.trials_per_stage) for name in names]
    if cfg.refine_trials > 0 and len(stages) > 1:
        stages.append(Stage(REFINE, union, cfg.refine_trials))
    return stages


def incumbent_of(trial: optuna.trial.FrozenTrial, source: str) -> Incumbent:
    return Incumbent({}, list(trial.values), dict(trial.constraints), source)


def spec_text(spec: ParamSpec) -> str:
    if spec.choices is not None:
        return str(list(spec.choices))
    return f"[{spec.low}, {spec.high}]{' log' if spec.log else ''}"
