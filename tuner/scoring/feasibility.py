"""Whether a measurement meets its constraints, in Optuna's convention (a value <= 0 is met).

Optuna's constrained samplers read a constraint as met when its value is <= 0; every constraint
here is a relative violation in that form, so one trial's feasibility, its total violation and
its mean over repeated measurements need nothing but these values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


def mean_constraints(repeats: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each constraint's mean violation over the repeats (<= 0: met on average)."""
    names = {name for r in repeats for name in r}
    return {n: float(np.mean([r[n] for r in repeats if n in r])) for n in sorted(names)}


def meets(constraints: Mapping[str, float]) -> bool:
    return all(v <= 0 for v in constraints.values())


def violation(constraints: Mapping[str, float]) -> float:
    """How far a measurement misses its constraints: the sum of the violated ones (0 if met)."""
    return float(sum(max(v, 0.0) for v in constraints.values()))


@dataclass(frozen=True)
class Edge:
    """A constraint met on the mean of its windows by less than one standard deviation of a
    window: a fresh window of the same configuration misses it ``miss_chance`` of the time."""

    name: str
    margin: float  # how far under the limit the mean is, relative to it (> 0)
    spread: float  # one window's standard deviation at this level, in the same units
    windows: int
    df: int  # the repeated windows the spread is pooled over, less one per configuration

    @property
    def miss_chance(self) -> float:
        return NormalDist().cdf(-self.margin / self.spread)

    def line(self) -> str:
        return (
            f"{self.name} met by {self.margin:.1%} on the mean of {self.windows} windows, where "
            f"repeated windows spread {self.spread:.1%} (SD over {self.df} df): a fresh window "
            f"misses it about {self.miss_chance:.0%} of the time"
        )


Windows = Sequence[Mapping[str, float]]


def pooled_cv(groups: Sequence[Windows], name: str) -> tuple[float, int]:
    """How far one constraint's measured value (value / limit = 1 + violation) moves between
    windows of one configuration, relative to its level, pooled over the configurations
    measured more than once; and its degrees of freedom. Relative, because a P99's noise scales
    with the P99: a point far under the SLO moves less in its units than one near it."""
    squares, df = 0.0, 0
    for windows in groups:
        levels = [1.0 + w[name] for w in windows if name in w]
        if len(levels) < 2 or min(levels) <= 0:
            continue
        cv = float(np.std(levels, ddof=1) / np.mean(levels))
        squares, df = squares + (len(levels) - 1) * cv**2, df + len(levels) - 1
    return (math.sqrt(squares / df), df) if df else (0.0, 0)


def edges(windows: Windows, others: Sequence[Windows] = ()) -> list[Edge]:
    """The constraints ``windows`` meet on their mean by less than one window's spread, that
    spread pooled over these windows and ``others`` (the study's other repeated configurations).
    A hand-over there is as likely a point just over the SLO that read under it: only more
    windows (``study.repeats``) tell the two apart."""
    out = []
    for name, mean in mean_constraints(windows).items():
        cv, df = pooled_cv([windows, *others], name)
        spread = cv * (1.0 + mean)
        if mean <= 0 and spread > 0 and -mean < spread:
            out.append(Edge(name, -mean, spread, sum(name in w for w in windows), df))
    return out
