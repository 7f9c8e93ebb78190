"""Typed configuration: one module per Hydra config group, registered in the ConfigStore.

Each group's dataclass lives in the module named after its ``conf/`` folder: ``server``,
``workload``, ``search_space``, ``study``, ``objectives`` (with the ``slo`` section the
objectives' constraints check), ``cost``, ``sampler``, ``quality``, ``plan`` and ``executor``
(the ``ray`` section). The sections that are no group (``telemetry``, ``placement``, ``check``)
and the root, :class:`TunerConfig`, stay here; every public name is re-exported, so
``from tuner.config import X`` is the way in.

The YAML files under ``conf/`` mirror these classes; the CLI composes them with Hydra and
converts once with ``OmegaConf.to_object`` (:func:`to_config`). Nothing below the CLI sees a
DictConfig. Validation that needs more than a type lives in :meth:`validate` methods, which raise
:class:`~tuner.errors.ConfigError` with a message naming the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.config.cost import CostConfig
from tuner.config.executor import EXECUTORS, RayConfig
from tuner.config.objectives import ObjectivesConfig, SloConfig
from tuner.config.plan import PlanConfig
from tuner.config.quality import QualityConfig
from tuner.config.sampler import SamplerConfig
from tuner.config.search_space import ParamSpec, param_spec
from tuner.config.server import MISSING_MODEL, ServerConfig, check_http_url
from tuner.config.study import NOISE_RULES, StudyConfig
from tuner.config.workload import WorkloadConfig
from tuner.errors import ConfigError

__all__ = [
    "EXECUTORS",
    "MISSING_MODEL",
    "NOISE_RULES",
    "CheckConfig",
    "CostConfig",
    "ObjectivesConfig",
    "ParamSpec",
    "PlacementConfig",
    "PlanConfig",
    "QualityConfig",
    "RayConfig",
    "SamplerConfig",
    "ServerConfig",
    "SloConfig",
    "StudyConfig",
    "TelemetryConfig",
    "TunerConfig",
    "WorkloadConfig",
    "check_http_url",
    "param_spec",
    "register_configs",
]


@dataclass
class TelemetryConfig:
    interval_s: float = 0.5
    nvml: bool = True  # sampled only when GPUs exist
    metrics_interval_s: float = 2.0
    client_saturation_cpu: float = 0.9  # fraction of one core
    # The client's mean E2E over vLLM's own at or above which (or its mean TPOT outside
    # 1/ratio..ratio) a trial warns that its latencies include time outside vLLM's engine.
    client_lag_ratio: float = 1.10

    def validate(self) -> None:
        if self.interval_s <= 0 or self.metrics_interval_s <= 0:
            raise ConfigError("telemetry: interval_s and metrics_interval_s must be > 0")
        if not 0 < self.client_saturation_cpu <= 1 or self.client_lag_ratio <= 1:
            raise ConfigError(
                "telemetry: client_saturation_cpu must be in (0, 1] (of one core) and "
                f"client_lag_ratio > 1 (a client cannot read tokens sooner than they are sent), "
                f"got {self.client_saturation_cpu} and {self.client_lag_ratio}"
            )


@dataclass
class PlacementConfig:
    """Which CPUs the server and the load generator run on (tuner.host.placement).

    Each side takes ``auto``, ``all`` (not pinned) or a CPU list such as ``0-6``. ``auto`` keeps
    the client off the server's cores (the last ``workload.processes`` CPUs for the client, the
    rest for vLLM), on a CPU or a GPU server.
    """

    server_cpus: str = "auto"
    client_cpus: str = "auto"


@dataclass
class CheckConfig:
    """What `tuner check`, `tuner compare` and a stage's decision must be able to see.

    ``resolve`` is the smallest relative change of an objective a verdict must detect (at the
    study's confidence, with 80 % power) before it may read PASS; ``resolves`` overrides it per
    objective. A verdict that cannot reads UNRESOLVED with the windows it would need.
    """

    resolve: float = 0.20
    resolves: dict[str, float] = field(default_factory=dict)
    max_windows: int = 12  # `tuner check`'s budget (--max-windows): what export plans for

    def validate(self) -> None:
        named = {f"check.resolves.{k}": v for k, v in self.resolves.items()}
        for name, value in {"check.resolve": self.resolve, **named}.items():
            if not 0 < value < 1:
                raise ConfigError(
                    f"{name} must be a fraction in (0, 1), got {value!r}",
                    hint="e.g. check.resolve=0.2: detect a 20 % change",
                )
        if self.max_windows < 1:
            raise ConfigError(f"check.max_windows must be >= 1, got {self.max_windows}")

    def target(self, objective: str) -> float:
        return self.resolves.get(objective, self.resolve)


@dataclass
class TunerConfig:
    """The root of the composed configuration."""

    name: str = "quickstart"
    studies_dir: str = "studies"
    server: ServerConfig = field(default_factory=ServerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    search_space: dict[str, dict[str, ParamSpec]] = field(default_factory=dict)
    objectives: ObjectivesConfig = field(default_factory=ObjectivesConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    check: CheckConfig = field(default_factory=CheckConfig)

    def __post_init__(self) -> None:
        # OmegaConf keeps dict[str, dict[str, ParamSpec]] untyped below the first level, so the
        # specs arrive as plain dicts; type them here, naming the offending key on error.
        self.search_space = {
            group: {param: param_spec(spec, f"{group}.{param}") for param, spec in specs.items()}
            for group, specs in self.search_space.items()
        }

    def validate(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"name={self.name!r} is not a valid study name")
        self.server.validate()
        self.workload.validate()
        self.slo.validate([c.name for c in self.workload.classes])
        self.quality.validate()
        self.telemetry.validate()
        self.plan.validate()
        self.check.validate()
        self.study.validate(sorted(self.search_space))


def register_configs() -> None:
    """Register the structured schema so Hydra type-checks the YAML against it."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="tuner_schema", node=TunerConfig)
