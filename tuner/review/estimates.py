"""Estimate against measurement, for every launched point of a study run with the plan.

With ``study.prescreen`` each launched trial keeps the estimator's TTFT and TPOT beside what was
measured (:data:`tuner.plan.estimate.PLAN_ATTRS`). The report shows both per trial, and how
well they agree over the study (Spearman's rho of the order, measured/estimated ratios): how
far the user may trust the estimator on this hardware. An estimate never decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tuner.plan.fidelity import TRIAL_METRICS, Agreement, trials_agreement
from tuner.review.stored import Review, TrialView
from tuner.schema import TrialAttr

MS = 1000.0


@dataclass(frozen=True)
class EstimateCheck:
    """Per launched point (``points``: label, estimated and measured ms) and over the study."""

    points: pd.DataFrame
    agreement: dict[str, Agreement]

    def lines(self) -> list[str]:
        return [
            f"estimate vs measurement over {len(self.points)} launched points: {a.line()}"
            for a in self.agreement.values()
        ]


def _estimated(view: TrialView) -> bool:
    """A launch of its own (a re-proposal answered from the storage repeats one) with both."""
    launched = view.measured and TrialAttr.REUSED_FROM not in view.attrs
    return launched and any(est in view.attrs for est, _ in TRIAL_METRICS.values())


def estimate_check(review: Review) -> EstimateCheck | None:
    """None when no measured trial carries an estimate (a study run without the plan)."""
    views = [
        v
        for v in [*review.search_trials(), *review.confirm_trials(), *review.baseline_windows]
        if _estimated(v)
    ]
    if not views:
        return None
    rows = []
    for view in views:
        row: dict[str, object] = {"trial": view.label, "role": view.role}
        for metric, (est_key, meas_key) in TRIAL_METRICS.items():
            estimated, measured = view.attrs.get(est_key), view.attrs.get(meas_key)
            row[f"{metric}_estimated_ms"] = estimated
            row[f"{metric}_measured_ms"] = None if measured is None else float(measured) * MS
        rows.append(row)
    return EstimateCheck(pd.DataFrame(rows), trials_agreement([v.attrs for v in views]))
