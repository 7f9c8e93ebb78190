"""Whether a measurement meets its constraints, in Optuna's convention (a value <= 0 is met).

Optuna's constrained samplers read a constraint as met when its value is <= 0; every constraint
here is a relative violation in that form, so one trial's feasibility, its total violation and
its mean over repeated measurements need nothing but these values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# A violation for "this constraint cannot be checked because there is no data". Large enough to
# rank below any measured violation, finite so it survives JSON (Optuna stores constraints as
# JSON system attrs, and the dashboard cannot read Infinity).
NO_DATA_VIOLATION = 1e6
# What an SLO that is not set reports: satisfied, with a margin that cannot look like a near miss.
UNSET_SLO = -1.0


def mean_constraints(repeats: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each constraint's mean violation over the repeats (<= 0: met on average)."""
    names = {name for r in repeats for name in r}
    return {n: float(np.mean([r[n] for r in repeats if n in r])) for n in sorted(names)}


def meets(constraints: Mapping[str, float]) -> bool:
    return all(v <= 0 for v in constraints.values())


def violation(constraints: Mapping[str, float]) -> float:
    """How far a measurement misses its constraints: the sum of the violated ones (0 if met)."""
    return float(sum(max(v, 0.0) for v in constraints.values()))
