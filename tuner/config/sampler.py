"""The ``sampler`` group: which Optuna sampler proposes a stage's trials (tuner.search.samplers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplerConfig:
    """An Optuna sampler by registered name (tpe, gp, nsga2, random, grid)."""

    name: str = "tpe"
    n_startup_trials: int = 2
    options: dict[str, Any] = field(default_factory=dict)
