"""A trial outcome, seen through the study's objectives and constraints.

Bridges :mod:`tuner.trial.run` (what was measured) and :mod:`tuner.scoring.objective` (what is
optimised): builds the :class:`~tuner.scoring.objective.ObjectiveContext` (prices, SLOs, devices
used, energy), evaluates, and lays the result out as Optuna user attrs that optuna-dashboard
shows as they are.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from tuner.config import TunerConfig
from tuner.host.placement import cpus_text
from tuner.measurement.measurements import Measurements
from tuner.quality import context_excess, quality_attrs
from tuner.schema import TrialAttr, TrialStatus, class_metric_attr, metric_attr
from tuner.scoring import objective as obj
from tuner.scoring.feasibility import meets
from tuner.search.resolved import resolve
from tuner.server import LaunchSpec
from tuner.trial.outcome import TrialOutcome

SIDES = ("server", "client")

FAILED_CONSTRAINT = "server_failed"  # > 0 when the trial produced no measurement at all


@dataclass
class Evaluated:
    outcome: TrialOutcome
    values: list[float]
    constraints: dict[str, float]
    names: list[str]

    @property
    def feasible(self) -> bool:
        return meets(self.constraints)

    def user_attrs(
        self, stage: str, role: str, params: dict[str, Any], launch: LaunchSpec
    ) -> dict[str, Any]:
        """Everything a reviewer needs in the dashboard, JSON-ready and secret-free."""
        o = self.outcome
        m = o.metrics()
        attrs: dict[str, Any] = {
            TrialAttr.STAGE: stage,
            TrialAttr.ROLE: role,
            TrialAttr.STATUS: o.status,
            TrialAttr.FAILURE_REASON: o.reason,
            TrialAttr.FAILURE_MESSAGE: o.message[:500],
            TrialAttr.VLLM_COMMAND: shlex.join(o.argv),
            TrialAttr.LAUNCH_ENV: dict(launch.env),
            TrialAttr.PARAMS_ALL: {k: _plain(v) for k, v in params.items()},
            TrialAttr.OBJECTIVE_VALUES: {
                n: _finite(v) for n, v in zip(self.names, self.values, strict=True)
            },
            TrialAttr.FEASIBLE: self.feasible,
            TrialAttr.FOLDER: o.folder,
            TrialAttr.TIMINGS: o.timings,
            TrialAttr.KV_CACHE_TOKENS: o.server.kv_cache_tokens if o.server else None,
            TrialAttr.CPUS: {side: cpus_text(o.placement.asked(side)) for side in SIDES},
        }
        if m is not None:
            attrs.update({metric_attr(k): _finite(v) for k, v in m.flat().items()})
            attrs[TrialAttr.WINDOW_SLICES] = [round(v, 2) for v in m.window_slices]
            attrs.update(class_attrs(m))
        attrs.update(quality_attrs(o.quality))
        return attrs

    def record(
        self,
        trial: optuna.Trial,
        stage: str,
        role: str,
        params: dict[str, Any],
        launch: LaunchSpec,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Keep the evaluation on ``trial`` before it is told: its user attrs (with
        ``extra``) and its constraints, in Optuna's convention (<= 0 is met)."""
        for key, value in {**self.user_attrs(stage, role, params, launch), **(extra or {})}.items():
            trial.set_user_attr(key, value)
        for key, value in self.constraints.items():
            trial.set_constraint(key, value)


def class_attrs(m: Measurements) -> dict[str, float]:
    """Each request class's flat measurements as attrs, only the finite ones: a class with no
    latency (all its requests failed) has no latency columns rather than a "nan" string."""
    return {
        class_metric_attr(name, key): value
        for name, flat in m.class_flat().items()
        for key, value in flat.items()
        if math.isfinite(value)
    }


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # JSON has no Infinity


class Evaluator:
    """The study's objectives and constraints, resolved once and applied to every outcome."""

    def __init__(self, config: TunerConfig, gpu_model: str = "") -> None:
        self.config = config
        self.gpu_model = gpu_model
        self.selection = obj.resolve(config.objectives, self._context({}, None))
        self.names = [o.name for o in self.selection.objectives]
        self.constraint_names = [c.name for c in self.selection.constraints]
        self.select_by = self.selection.select_by.name
        if self.select_by not in self.names:
            self.names.append(self.select_by)
            self.selection.objectives.append(self.selection.select_by)
        self.directions = [o.direction for o in self.selection.objectives]
        self.select_index = self.names.index(self.select_by)
        self.select_sign = 1.0 if self.directions[self.select_index] == "maximize" else -1.0

    def scoring(self) -> dict[str, Any]:
        """What a stored trial's values and constraints mean: its objectives in order, its
        constraints, and the prices behind the cost objective."""
        return {
            "objectives": list(self.names),
            "constraints": list(self.constraint_names),
            "cost": asdict(self.config.cost),
        }

    def _context(
        self, params: dict[str, Any], outcome: TrialOutcome | None
    ) -> obj.ObjectiveContext:
        cfg = self.config
        gpu = outcome.telemetry.gpu if outcome else {}
        m = outcome.metrics() if outcome else None
        return obj.ObjectiveContext(
            cost=cfg.cost,
            slo=cfg.slo,
            device=cfg.server.device,
            gpus_used=resolve(LaunchSpec(args=dict(params)), cfg.server).devices,
            gpu_model=self.gpu_model,
            cpus=len((outcome.placement.server or ()) if outcome else ()),
            energy_j=gpu.get("energy_j"),
            window_s=m.window_s if m else 0.0,
            quality_excess=context_excess(outcome.quality) if outcome else None,
        )

    def evaluate(self, outcome: TrialOutcome, params: dict[str, Any]) -> Evaluated:
        m = outcome.metrics()
        if not outcome.ok or m is None:
            ev = obj.failed_evaluation(self.selection)
            constraints = {**ev.violations, FAILED_CONSTRAINT: obj.NO_DATA_VIOLATION}
        else:
            ev = obj.evaluate(self.selection, m, self._context(params, outcome))
            constraints = {**ev.violations, FAILED_CONSTRAINT: -1.0}
        values = [
            v if not math.isnan(v) else o.worst()
            for v, o in zip(ev.values, self.selection.objectives, strict=True)
        ]
        return Evaluated(outcome, values, constraints, self.names)

    def from_attrs(self, trial: optuna.trial.FrozenTrial) -> Evaluated:
        """Rebuild a stored evaluation (for resume) from a finished trial."""
        outcome = TrialOutcome(
            trial_id=str(trial.number),
            status=TrialStatus(trial.user_attrs.get(TrialAttr.STATUS, TrialStatus.OK)),
            argv=shlex.split(trial.user_attrs.get(TrialAttr.VLLM_COMMAND, "")),
            launch=LaunchSpec(),
            reason=trial.user_attrs.get(TrialAttr.FAILURE_REASON, ""),
            folder=trial.user_attrs.get(TrialAttr.FOLDER, ""),
        )
        return Evaluated(outcome, list(trial.values), dict(trial.constraints), self.names)
