"""A study's estimate of its own measurement noise, for the acceptance rule.

One comparison's own measurements (2 + 2 with the quickstart's ``study.repeats=1`` and one
baseline window) give a variance with 2 degrees of freedom: as often far too small as too large,
so "two standard errors" of it took an equal configuration for a gain in 7-9 % of comparisons
instead of the ~2.5 % the rule suggests (tests/unit/test_noise.py simulates it). The
run-to-run noise is a property of the host and the workload, about the same share of the value
for every configuration (repeats measured 5-15 % apart whatever the config), so
the ``pooled`` rule estimates it once for the whole study: the variance of log(value) within
every configuration measured more than once (the baseline's windows, each confirmation's
incumbent and candidate), and a threshold of Student's t at the pooled degrees of freedom,
wide while few repeats are known and near two standard errors once many are.

``pair`` is the earlier rule (each comparison's own variances, two standard errors), kept so
that a replay can measure the two side by side.

:class:`NoiseSplit` says where the noise comes from: each window's token rate in equal slices
(``Measurements.window_slices``) against the spread between launches. A longer window averages
only the first part away; only more launches average the second.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

CONFIDENCE = 0.975  # one-sided: about the 2.3 % of the earlier "two standard errors"
# A verdict "resolves" a change it would flag at least this often: at the threshold itself a
# real change is flagged only half the time, so a PASS there would still miss it every other run.
POWER = 0.8
MOST_WINDOWS = 10_000  # where the search for "how many windows would do" gives up


@dataclass(frozen=True)
class NoiseEstimate:
    """The pooled relative noise: the SD of log(value) between repeats of one configuration."""

    rel_sd: float  # ~ the coefficient of variation; nan while nothing was repeated
    df: int  # its degrees of freedom: measurements minus configurations, over repeated ones

    def threshold(self, n_a: int, n_b: int, scale: float) -> float:
        """The smallest difference of two means (of n_a and n_b measurements near ``scale``)
        that this noise makes unlikely by chance; 0 when the noise is unknown (df 0), where
        the rule's ``min_gain`` alone holds, as with a single window before."""
        if self.df < 1 or n_a < 1 or n_b < 1:
            return 0.0
        t = float(stats.t.ppf(CONFIDENCE, self.df))
        return t * self.rel_sd * math.sqrt(1 / n_a + 1 / n_b) * abs(scale)

    def resolution(self, n_a: int, n_b: int) -> float:
        """The smallest relative change between two means of n_a and n_b measurements that
        this noise lets the rule detect at ``CONFIDENCE`` with ``POWER``: (t at CONFIDENCE +
        t at POWER, both at this df) x rel_sd x sqrt(1/n_a + 1/n_b); inf while it is unknown."""
        if self.df < 1 or n_a < 1 or n_b < 1 or not math.isfinite(self.rel_sd):
            return math.inf
        t = float(stats.t.ppf(CONFIDENCE, self.df) + stats.t.ppf(POWER, self.df))
        return t * self.rel_sd * math.sqrt(1 / n_a + 1 / n_b)

    def more_windows(self, n_a: int, n_b: int, target: float, both: bool = False) -> int | None:
        """How many more measurements (on side b, or on each side with ``both``), each one a
        repeat that adds a degree of freedom to the pool, bring the resolution to ``target``;
        0 when it is already there, None when no number would (the other side's share alone
        exceeds it) or the noise is unknown."""
        if not math.isfinite(self.rel_sd) or self.df < 1 or n_a < 1 or n_b < 1:
            return None

        def resolves(k: int) -> bool:  # falls monotonically with k, so a bisection finds it
            grown = NoiseEstimate(self.rel_sd, self.df + k * (1 + int(both)))
            return grown.resolution(n_a + k * int(both), n_b + k) <= target

        if not resolves(MOST_WINDOWS):
            return None
        low, high = -1, MOST_WINDOWS  # resolves(high) holds; resolves(low) does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if mid >= 0 and resolves(mid) else (mid, high)
        return high

    @classmethod
    def of(cls, *groups: Sequence[float]) -> NoiseEstimate:
        """Pool the within-group variance of log(value) over groups of repeats."""
        ss, df = 0.0, 0
        for values in groups:
            logs = np.log([v for v in values if math.isfinite(v) and v > 0])
            if len(logs) >= 2:
                ss += float(np.sum((logs - logs.mean()) ** 2))
                df += len(logs) - 1
        return cls(math.sqrt(ss / df) if df else math.nan, df)


class NoisePool:
    """Every configuration's repeated selection-objective values in one study.

    A configuration's measurements only grow during a study (an incumbent carries its samples
    into the next stage's confirmation), so each configuration keeps its longest list: adding
    the same measurements again, as a resumed study does, changes nothing.
    """

    def __init__(self) -> None:
        self._groups: dict[str, list[float]] = {}

    def add(self, config: Mapping[str, Any], values: Sequence[float]) -> None:
        key = _key(config)
        if len(values) > len(self._groups.get(key, [])):
            self._groups[key] = [float(v) for v in values]

    def estimate(self) -> NoiseEstimate:
        return NoiseEstimate.of(*self._groups.values())


class WindowPool:
    """Every configuration's constraint windows in one study: the spread an SLO claim pools
    (tuner.scoring.confidence). As in :class:`NoisePool`, a configuration keeps its longest
    list, so a resumed study that adds the same windows again changes nothing."""

    def __init__(self) -> None:
        self._groups: dict[str, list[dict[str, float]]] = {}

    def add(self, config: Mapping[str, Any], windows: Sequence[Mapping[str, float]]) -> None:
        key = _key(config)
        if len(windows) > len(self._groups.get(key, [])):
            self._groups[key] = [dict(w) for w in windows]

    def others(self, config: Mapping[str, Any]) -> list[list[dict[str, float]]]:
        """Every configuration's windows but ``config``'s own."""
        key = _key(config)
        return [w for k, w in self._groups.items() if k != key]


def _key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)


@dataclass(frozen=True)
class NoiseSplit:
    """One-way random-effects split of log rates measured as launches × equal slices.

    ``slice_sd`` is one slice's SD within its launch; ``launch_sd`` the part of the launch
    means' spread that the slices' own noise does not explain (0 when it explains all);
    ``p_launches_differ`` the F-test's p-value for "launches differ by more than their slices
    do". SDs of log values are relative spreads."""

    launches: int
    slices: int
    slice_sd: float
    launch_sd: float
    f: float
    p_launches_differ: float

    @property
    def launch_mean_sd(self) -> float:
        """The SD of one launch's mean that both parts predict."""
        return math.sqrt(self.launch_sd**2 + self.slice_sd**2 / self.slices)

    @classmethod
    def of(cls, launches: Sequence[Sequence[float]]) -> NoiseSplit | None:
        """None unless ≥ 2 launches of the same ≥ 2 positive, finite slices each."""
        rows = [list(r) for r in launches]
        k = len(rows[0]) if rows else 0
        if len(rows) < 2 or k < 2 or any(len(r) != k for r in rows):
            return None
        values = np.asarray(rows, dtype=float)
        if not np.all(np.isfinite(values) & (values > 0)):
            return None
        logs = np.log(values)
        ms_within = float(logs.var(axis=1, ddof=1).mean())
        ms_between = float(k * logs.mean(axis=1).var(ddof=1))
        f = ms_between / ms_within if ms_within > 0 else math.inf
        return cls(
            launches=len(rows),
            slices=k,
            slice_sd=math.sqrt(ms_within),
            launch_sd=math.sqrt(max(0.0, (ms_between - ms_within) / k)),
            f=f,
            p_launches_differ=float(stats.f.sf(f, len(rows) - 1, len(rows) * (k - 1))),
        )
