"""The Objective / Constraint seam: measurements → the numbers Optuna optimises.

An :class:`Objective` turns one trial's :class:`~tuner.measurement.Measurements` into a float that
Optuna minimises or maximises; a :class:`Constraint` turns them into a violation (> 0 violated,
<= 0 satisfied) that Optuna 5 stores with ``trial.set_constraint`` (or a ``constraints_func``)
and that TPE, GP and NSGA-II use to steer away from infeasible regions.

Implementations live in the top-level ``objectives/`` package and register themselves by name::

    @register_objective
    class P99E2E(Objective):
        name = "p99_e2e_latency"
        direction = MINIMIZE
        unit = "s"

        def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
            return stat_or_nan(m.e2e.p99)

:func:`load_plugins` imports every module of ``objectives/`` and every module that an installed
package declares under the ``tuner.objectives`` entry-point group. Unknown names raise
:class:`~tuner.errors.ConfigError` listing the known ones.

Missing data is never a good number: an objective returns NaN when a statistic does not exist
(Optuna then fails the trial), a constraint returns :data:`NO_DATA_VIOLATION`, and a trial whose
server never served gets :func:`failed_evaluation` (worst values, every constraint violated) so
that samplers learn to avoid it instead of ignoring it.
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import metadata
from typing import ClassVar, Literal, TypeVar

from tuner.config import CostConfig, ObjectivesConfig, SloConfig
from tuner.config.objectives import CLASS_SLO_METRICS
from tuner.errors import ConfigError
from tuner.measurement.stats import Measurements
from tuner.scoring.feasibility import NO_DATA_VIOLATION, UNSET_SLO, meets

# Literal, so that a list of directions goes to optuna.create_study as it is typed there.
Direction = Literal["minimize", "maximize"]
MINIMIZE: Direction = "minimize"
MAXIMIZE: Direction = "maximize"
DIRECTIONS: tuple[Direction, ...] = (MINIMIZE, MAXIMIZE)
PLUGIN_PACKAGE = "objectives"
# The entry-point group under which an installed package declares objective modules of its own
ENTRY_POINT_GROUP = "tuner.objectives"


@dataclass
class ObjectiveContext:
    """What an objective may need besides the measurements: prices, SLOs and the hardware."""

    cost: CostConfig = field(default_factory=CostConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    device: str = "cpu"  # cpu | cuda
    gpus_used: int = 0  # TP x PP x DP of the trial (cuda only)
    gpu_model: str = ""  # e.g. NVML's "NVIDIA H200"; cost.gpu_model wins when set
    cpus: int = 0  # CPUs the trial's server was pinned to (tuner.host.placement); 0 = not pinned
    energy_j: float | None = None  # GPU energy over `window_s` (NVML); None = not measured
    window_s: float = 0.0  # the window over which energy_j was measured
    # The quality gate (tuner.quality): per gated metric, (baseline - candidate) - tolerance.
    # None = the gate does not apply to this trial; {} = it applies but had nothing to compare.
    quality_excess: dict[str, float] | None = None

    @property
    def billed_cpus(self) -> int:
        """cost.cpus when set (the price basis is the operator's), else the server's CPUs."""
        return self.cost.cpus or self.cpus or os.cpu_count() or 1


class Objective(ABC):
    """One optimised quantity. Subclasses set the class attributes and :meth:`value`."""

    name: ClassVar[str]
    direction: ClassVar[Direction]
    unit: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
        """The objective's value; NaN when the measurement cannot say (never a fake best)."""

    def available(self, ctx: ObjectiveContext) -> bool:
        """Whether this objective can be measured at all in ``ctx`` (checked at study set-up)."""
        return True

    def validate(self, ctx: ObjectiveContext) -> None:
        """Raise ConfigError at study set-up if this objective cannot work in ``ctx``."""
        if not self.available(ctx):
            raise ConfigError(
                f"objective {self.name!r} is not available on device={ctx.device!r}",
                hint="remove it from objectives.names",
            )

    def worst(self) -> float:
        """The value a failed trial reports: the worst possible one in this direction."""
        return math.inf if self.direction == MINIMIZE else -math.inf


class Constraint(ABC):
    """A feasibility condition: :meth:`violation` > 0 violated, <= 0 satisfied."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        """Violation amount (> 0 violated); never NaN (Optuna rejects NaN constraints)."""


ObjectiveT = TypeVar("ObjectiveT", bound=type[Objective])
ConstraintT = TypeVar("ConstraintT", bound=type[Constraint])

_OBJECTIVES: dict[str, type[Objective]] = {}
_CONSTRAINTS: dict[str, type[Constraint]] = {}
_loaded = False


def _register(registry: dict[str, type], kind: str, cls: type) -> None:
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind} class {cls.__qualname__} has no `name`")
    old = registry.get(name)
    # Re-importing the same module re-creates the class; only a different class is a clash.
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ConfigError(
            f"{kind} {name!r} is registered twice: {old.__module__}.{old.__qualname__} and "
            f"{cls.__module__}.{cls.__qualname__}",
            hint="rename one of them",
        )
    registry[name] = cls


def register_objective(cls: ObjectiveT) -> ObjectiveT:
    """Register an Objective subclass by its ``name``; usable as a class decorator."""
    if getattr(cls, "direction", None) not in DIRECTIONS:
        raise ConfigError(
            f"objective class {cls.__qualname__}: direction must be one of {DIRECTIONS}"
        )
    _register(_OBJECTIVES, "objective", cls)
    return cls


def register_constraint(cls: ConstraintT) -> ConstraintT:
    """Register a Constraint subclass by its ``name``; usable as a class decorator."""
    _register(_CONSTRAINTS, "constraint", cls)
    return cls


def load_plugins() -> list[str]:
    """Import the built-in objectives and the plugins installed packages declare.

    The built-ins are every module of the ``objectives`` package. A package of your own
    declares its modules under the ``tuner.objectives`` entry-point group (see README.md), so
    that installing it is all it takes; nothing is added to any import path. Returns the
    modules imported.
    """
    global _loaded
    package = importlib.import_module(PLUGIN_PACKAGE)
    names = []
    for found in pkgutil.iter_modules(package.__path__):
        if not found.name.startswith("_"):
            name = f"{PLUGIN_PACKAGE}.{found.name}"
            _import_plugin(name, f"fix or remove {PLUGIN_PACKAGE}/{found.name}.py")
            names.append(name)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        owner = entry.dist.name if entry.dist is not None else "its package"
        _import_plugin(entry.module, f"fix or uninstall {owner}")
        names.append(entry.module)
    _loaded = True
    return names


def _import_plugin(module: str, hint: str) -> None:
    try:
        importlib.import_module(module)
    except ConfigError:
        raise  # e.g. a name registered twice: already says what to do
    except Exception as exc:  # a user's module: report which one, not a bare traceback
        raise ConfigError(
            f"objectives plugin {module!r} failed to import: {type(exc).__name__}: {exc}",
            hint=hint,
        ) from exc


def _ensure_loaded() -> None:
    if not _loaded:
        load_plugins()


def known_objectives() -> list[str]:
    _ensure_loaded()
    return sorted(_OBJECTIVES)


def known_constraints() -> list[str]:
    _ensure_loaded()
    return sorted(_CONSTRAINTS)


def get_objective(name: str) -> Objective:
    """A new instance of the objective registered as ``name``."""
    _ensure_loaded()
    try:
        return _OBJECTIVES[name]()
    except KeyError:
        raise ConfigError(
            f"objective {name!r} is unknown (known: {', '.join(known_objectives())})",
            hint="fix objectives.names / objectives.select_by, or install the plugin defining it",
        ) from None


class ClassSlo(Constraint):
    """One request class's P99 SLO (``slo.classes.<class>.p99_<metric>_s``), relative to its
    limit like the SLOs over every request. Made per set SLO (:func:`class_slos`), not
    registered: its name says its class, and there are as many as the SLO config sets."""

    request_class: ClassVar[str]
    metric: ClassVar[str]  # e2e | ttft | tpot

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        stats = m.by_class.get(self.request_class)
        limit = ctx.slo.class_slo(self.request_class).limits().get(self.metric, 0.0)
        if stats is None or stats.requests_started == 0:
            # no request of the class in the window: nothing says it met its SLO
            return NO_DATA_VIOLATION if limit > 0 else UNSET_SLO
        if limit > 0 and stats.rejected == stats.requests_started:
            # every one too long for this server's context (a tier cap): it serves none of the
            # class, whose latency is another tier's; the rejected-rate bounds judge the cap
            return UNSET_SLO
        metric = getattr(stats, self.metric)
        if self.metric == "tpot" and stats.completed > 0 and metric.n == 0:
            return UNSET_SLO  # only 1-token outputs: no TPOT exists (as slo_p99_tpot)
        return relative_violation(metric.p99, limit)


class ClassRejectedRate(Constraint):
    """One request class's share of requests refused as too long for the server's context
    (``slo.classes.<class>.max_rejected_rate``), like ``rejected_rate`` over every request,
    which still applies beside it. Made per set bound (:func:`class_slos`), not registered."""

    request_class: ClassVar[str]

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        stats = m.by_class.get(self.request_class)
        limit = ctx.slo.class_slo(self.request_class).max_rejected_rate
        if limit is None:
            return UNSET_SLO
        if stats is None or stats.requests_started == 0:
            return NO_DATA_VIOLATION  # no request of the class sent: nothing says it fits
        return stats.rejected_rate - limit


def class_slo_name(request_class: str, metric: str) -> str:
    return f"slo_{request_class}_p99_{metric}"


def class_of_slo(name: str) -> tuple[str, str] | None:
    """(class, metric) of a name :func:`class_slo_name` made; None for an SLO over every
    request (``slo_p99_ttft``) or any other constraint."""
    head, sep, metric = name.rpartition("_p99_")
    if not sep or not head.startswith("slo_") or metric not in CLASS_SLO_METRICS:
        return None
    request_class = head.removeprefix("slo_")
    return (request_class, metric) if request_class else None


def class_rejected_name(request_class: str) -> str:
    """Not ``slo_``-prefixed: like ``rejected_rate`` and ``error_rate`` (not a latency SLO), a
    summary shows it where it is not met."""
    return f"rejected_rate_{request_class}"


def class_slos(slo: SloConfig) -> list[Constraint]:
    """A constraint for each class SLO ``slo`` sets: ``slo_<class>_p99_<metric>`` for a
    latency, ``rejected_rate_<class>`` for a bound on rejected requests."""
    out: list[Constraint] = []
    for request_class, metric, _limit in slo.class_limits():
        name = class_slo_name(request_class, metric)
        attrs = {"name": name, "request_class": request_class, "metric": metric}
        out.append(type(f"ClassSlo[{name}]", (ClassSlo,), attrs)())
    for request_class, _bound in slo.class_rejected_limits():
        name = class_rejected_name(request_class)
        attrs = {"name": name, "request_class": request_class}
        out.append(type(f"ClassRejectedRate[{name}]", (ClassRejectedRate,), attrs)())
    return out


def get_constraint(name: str, slo: SloConfig | None = None) -> Constraint:
    """A new instance of the constraint registered as ``name``, or of the class SLO of ``slo``
    that has this name."""
    _ensure_loaded()
    for made in class_slos(slo) if slo is not None else []:
        if made.name == name:
            return made
    try:
        return _CONSTRAINTS[name]()
    except KeyError:
        raise ConfigError(
            f"constraint {name!r} is unknown (known: {', '.join(known_constraints())})",
            hint="fix objectives.constraints, or install the plugin that defines it",
        ) from None


@dataclass
class Selection:
    """The objectives, constraints and selection objective of a study, resolved and checked."""

    objectives: list[Objective]
    constraints: list[Constraint]
    select_by: Objective

    @property
    def directions(self) -> list[Direction]:
        return [o.direction for o in self.objectives]


def resolve(config: ObjectivesConfig, ctx: ObjectiveContext) -> Selection:
    """Look up every configured name and check availability (ConfigError at study set-up)."""
    if not config.names:
        raise ConfigError("objectives.names is empty", hint="name at least one objective")
    if len(set(config.names)) != len(config.names):
        raise ConfigError(f"objectives.names has duplicates: {config.names}")
    objectives = [get_objective(n) for n in config.names]
    select_by = get_objective(config.select_by)
    for objective in [*objectives, select_by]:
        objective.validate(ctx)
    constraints = [get_constraint(n) for n in config.constraints] + class_slos(ctx.slo)
    return Selection(objectives, constraints, select_by)


@dataclass
class Evaluation:
    """One trial as Optuna sees it: objective values (in order) and named violations."""

    values: list[float]
    violations: dict[str, float]

    @property
    def feasible(self) -> bool:
        return meets(self.violations)

    @property
    def complete(self) -> bool:
        """False when a value is NaN (the evaluator then tells the objective's worst value)."""
        return not any(math.isnan(v) for v in self.values)


def evaluate(selection: Selection, m: Measurements, ctx: ObjectiveContext) -> Evaluation:
    values = [o.value(m, ctx) for o in selection.objectives]
    violations = {c.name: _no_nan(c.violation(m, ctx)) for c in selection.constraints}
    return Evaluation(values, violations)


def failed_evaluation(selection: Selection) -> Evaluation:
    """A trial whose server failed: told as COMPLETE-but-infeasible so samplers learn from it.

    A FAIL state would be ignored by TPE/GP/NSGA-II, which would then propose the same failing
    configuration again; zeros would look like a perfect latency.
    """
    values = [o.worst() for o in selection.objectives]
    return Evaluation(values, {c.name: NO_DATA_VIOLATION for c in selection.constraints})


def _no_nan(value: float) -> float:
    return NO_DATA_VIOLATION if math.isnan(value) else float(value)


def stat_or_nan(value: float | None) -> float:
    """A statistic for an objective: NaN when the sample was empty (Measurements uses None)."""
    return math.nan if value is None else float(value)


def has_traffic(m: Measurements) -> bool:
    """Whether any request was started in the window (an empty window proves nothing)."""
    return m.requests_started > 0


def relative_violation(value: float | None, limit: float) -> float:
    """(value - limit) / limit for an upper-bound SLO; UNSET_SLO when limit is 0 (not set)."""
    if limit <= 0:
        return UNSET_SLO
    if value is None or math.isnan(value):
        return NO_DATA_VIOLATION
    return (value - limit) / limit
