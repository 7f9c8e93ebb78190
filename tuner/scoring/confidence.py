"""Whether a configuration meets an SLO, as a claim with a stated confidence.

A P99 over a short window rests on its few slowest requests, so one configuration's windows
scatter around its true P99 (5 % between launches on GPUs, more on a shared CPU host). A point
whose windows read 2 % under the SLO on their mean is as likely a point 1 % over it that read
low. A hand-over is a promise that the SLO holds in production, so it is made only where the
windows bound the P99 under the SLO at ``study.slo_confidence`` (0.9 by default):

    level     = value / limit of each window (1 + its violation)
    se        = cv * mean(level) / sqrt(windows)   (cv: one window's relative spread, pooled
                over every configuration the study measured more than once, as the gain
                rule pools its noise)
    bound     = mean(level) + t(confidence, df) * se        (one-sided, upper)
    confident = P(true level <= 1) = T_df((1 - mean(level)) / se)

An SLO is ``met`` where ``confident`` reaches the confidence asked, ``missed`` where the same
confidence says it is over, and ``undecided`` between: more windows decide it, and until they
do the configuration is not handed over as meeting it. At a confidence of 0.5 the bound is the
mean, the rule before this one. A spread still unknown (nothing repeated yet) leaves the mean to
decide and says so (the claim's confidence is None: JSON and the dashboard read no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from scipy import stats

from tuner.scoring.feasibility import NO_DATA_VIOLATION, UNSET_SLO, mean_constraints

Windows = Sequence[Mapping[str, float]]
MOST_WINDOWS = 1000  # where "how many windows would decide it" gives up


class SloStatus(StrEnum):
    MET = "met"  # under the limit with the confidence asked
    MISSED = "missed"  # over it with that confidence
    UNDECIDED = "undecided"  # the windows cannot tell yet


@dataclass(frozen=True)
class SloClaim:
    """One constraint of one configuration, judged on its windows at ``target`` confidence."""

    name: str
    mean: float  # the mean violation over the windows (<= 0: met on the mean)
    bound: float  # the violation at the one-sided upper bound (<= 0: met with confidence)
    confidence: float | None  # how sure the windows are that it is met; None: spread unknown
    target: float  # the confidence asked (study.slo_confidence)
    windows: int
    spread: float  # one window's relative SD (cv), pooled
    df: int  # its degrees of freedom

    @property
    def margin(self) -> float:
        """How far under the limit the mean is, relative to the limit (< 0: over it)."""
        return -self.mean

    @property
    def status(self) -> SloStatus:
        if self.mean >= NO_DATA_VIOLATION or self.confidence is None:
            return SloStatus.MET if self.mean <= 0 else SloStatus.MISSED
        if self.confidence >= self.target:
            return SloStatus.MET
        if self.confidence <= 1 - self.target:
            return SloStatus.MISSED
        return SloStatus.UNDECIDED

    def more_windows(self) -> int | None:
        """How many more windows, at this mean and spread, would decide the claim (0 when it is
        decided; None when no number would: the mean sits on the limit, or the spread is
        unknown)."""
        if self.status != SloStatus.UNDECIDED:
            return 0
        level = 1.0 + self.mean
        if self.spread <= 0 or level <= 0 or self.mean == 0:
            return None
        for extra in range(1, MOST_WINDOWS):
            n, df = self.windows + extra, self.df + extra
            t = float(stats.t.ppf(self.target, df))
            if abs(self.mean) >= t * self.spread * level / math.sqrt(n):
                return extra
        return None

    def text(self) -> str:
        """One line a user reads: what the windows say of this SLO, and how sure they are."""
        where = "under" if self.mean <= 0 else "over"
        head = (
            f"{self.name} {self.status.value}: {abs(self.mean):.1%} {where} its limit on the "
            f"mean of {self.windows} window{'s' * (self.windows != 1)}"
        )
        if self.confidence is None:
            return f"{head} (their spread is unknown: the mean decides)"
        sure = f"{self.confidence:.0%} sure it is met (asked {self.target:.0%})"
        return f"{head}, spread {self.spread:.1%} a window: {sure}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SloClaim:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def pooled_cv(groups: Sequence[Windows], name: str) -> tuple[float, int]:
    """How far one constraint's level (value / limit) moves between windows of one
    configuration, relative to its level, pooled over the configurations measured more than
    once; and its degrees of freedom. Relative, because a P99's noise scales with the P99: a
    point far under the SLO moves less in its units than one near it. A failed window (its
    sentinel violation) says nothing about the spread of a running server and is left out."""
    squares, df = 0.0, 0
    for windows in groups:
        levels = [1.0 + w[name] for w in windows if name in w and w[name] < NO_DATA_VIOLATION]
        if len(levels) < 2 or min(levels) <= 0:
            continue
        cv = float(np.std(levels, ddof=1) / np.mean(levels))
        squares, df = squares + (len(levels) - 1) * cv**2, df + len(levels) - 1
    return (math.sqrt(squares / df), df) if df else (0.0, 0)


def claim(name: str, windows: Windows, others: Sequence[Windows], target: float) -> SloClaim:
    """The claim ``windows`` make of constraint ``name``, their spread pooled with ``others``
    (the study's other repeated configurations)."""
    mean = mean_constraints(windows)[name]
    n = sum(name in w for w in windows)
    cv, df = pooled_cv([windows, *others], name)
    level = 1.0 + mean
    if df < 1 or mean >= NO_DATA_VIOLATION:
        return SloClaim(name, mean, mean, None, target, n, cv, df)
    se = cv * max(level, 0.0) / math.sqrt(n)
    if se <= 0:  # windows that never moved (an error rate of 0): the mean is certain
        sure = 1.0 if mean <= 0 else 0.0
        return SloClaim(name, mean, mean, sure, target, n, cv, df)
    bound = level + float(stats.t.ppf(target, df)) * se - 1.0
    sure = float(stats.t.cdf((1.0 - level) / se, df))
    return SloClaim(name, mean, bound, sure, target, n, cv, df)


def claims(windows: Windows, others: Sequence[Windows], target: float) -> list[SloClaim]:
    """Every constraint's claim (sorted by name); none for no windows."""
    names = sorted({n for w in windows for n in w})
    return [claim(n, windows, others, target) for n in names]


def shown(found: Sequence[SloClaim]) -> list[SloClaim]:
    """What a user reads of a configuration's claims: every SLO that is set, and another
    constraint (the error rate, a failed launch) only where it is not met."""
    return [
        c
        for c in found
        if (c.name.startswith("slo_") and c.mean != UNSET_SLO) or c.status != SloStatus.MET
    ]


def confidently_met(found: Sequence[SloClaim]) -> bool:
    return all(c.status == SloStatus.MET for c in found)


def undecided(found: Sequence[SloClaim]) -> list[SloClaim]:
    return [c for c in found if c.status == SloStatus.UNDECIDED]


def bound_violation(found: Sequence[SloClaim]) -> float:
    """How far the claims miss at their confidence bound: the sum of the bounds over the limit
    (0 where every SLO is met with confidence), as :func:`violation` sums the means."""
    return float(sum(max(c.bound, 0.0) for c in found))
