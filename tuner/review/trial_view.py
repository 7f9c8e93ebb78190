"""One stored trial as the review sees it, and the Pareto filter.

A :class:`TrialView` is a FrozenTrial with the name of its Optuna study and its stage, plus the
reads that report, export and dashboard share: role, status, feasibility, the full params, the
flat measurements (``m_*`` user attrs) and the trial folder's result.json (telemetry).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from optuna.trial import FrozenTrial, TrialState

from tuner.schema import TrialAttr, TrialStatus, metric_attr
from tuner.scoring.feasibility import meets


@dataclass(frozen=True)
class TrialView:
    """One stored trial with the study it belongs to."""

    study: str
    stage: str
    trial: FrozenTrial

    @property
    def attrs(self) -> dict[str, Any]:
        return self.trial.user_attrs

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def role(self) -> str:
        return str(self.attrs.get(TrialAttr.ROLE, ""))

    @property
    def ok(self) -> bool:
        status = self.attrs.get(TrialAttr.STATUS, TrialStatus.OK)
        return self.trial.state == TrialState.COMPLETE and status == TrialStatus.OK

    @property
    def feasible(self) -> bool:
        return self.ok and meets(self.trial.constraints)

    @property
    def measured(self) -> bool:
        """A trial with its own measurement (not a seeded incumbent copy)."""
        return self.ok and metric_attr("completed") in self.attrs

    @property
    def label(self) -> str:
        return f"{self.stage}#{self.number}"

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.attrs.get(TrialAttr.PARAMS_ALL) or self.trial.params)

    @property
    def folder(self) -> Path | None:
        folder = self.attrs.get(TrialAttr.FOLDER)
        return Path(folder) if folder else None

    def metric(self, name: str) -> float | None:
        """A flat measurement (``m_<name>`` user attr) as a float, None if absent or not finite."""
        value = self.attrs.get(metric_attr(name))
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return number if math.isfinite(number) else None

    @cached_property
    def result(self) -> dict[str, Any]:
        """result.json of the trial folder ({} when the folder is not on this machine)."""
        if self.folder is None:
            return {}
        try:
            data = json.loads((self.folder / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def telemetry(self) -> dict[str, Any]:
        return dict(self.result.get("telemetry", {}))


def nondominated(values: np.ndarray, directions: list[str]) -> list[int]:
    """Indices of the rows of ``values`` that no other row dominates (directions per column)."""
    signs = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    costs = values * signs  # all minimised
    keep = []
    for i, row in enumerate(costs):
        others = np.delete(costs, i, axis=0)
        dominated = np.any(np.all(others <= row, axis=1) & np.any(others < row, axis=1))
        if not dominated:
            keep.append(i)
    return keep
