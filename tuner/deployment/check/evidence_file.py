"""evidence.json (written by `tuner export`) read back as what `tuner check` compares with.

Its ``check`` block (tuner/review/evidence.py) holds the model, how the study scored a
measurement, each objective over the exported configuration's own windows and the study's
pooled noise of each objective; ``workload`` and ``slo`` are the study's. Anything missing or
malformed is one ConfigError line (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tuner.config import CheckConfig, CostConfig, SloConfig
from tuner.config.workload import (
    LengthDist,
    PrefixConfig,
    RequestClass,
    SessionConfig,
    TraceConfig,
    WorkloadConfig,
)
from tuner.deployment.check.endpoint import Scoring
from tuner.errors import ConfigError
from tuner.scoring.objective import ObjectiveContext
from tuner.study.decision.noise import NoiseEstimate

DEFAULT_RESOLVE = CheckConfig().resolve


@dataclass(frozen=True)
class Reference:
    """What the study measured of the exported configuration, and how it judged noise."""

    path: Path
    study: str
    choice: str
    model: str  # the model's path in the study
    model_sha256: str  # of its config.json ("" when unknown)
    served_model_name: str | None
    workload: WorkloadConfig
    slo: SloConfig
    scoring: Scoring
    samples: dict[str, list[float]]  # objective -> its values over the configuration's windows
    noise: dict[str, NoiseEstimate]  # objective -> the study's pooled noise of it
    min_gain: float
    resolve: dict[str, float] = field(default_factory=dict)  # objective -> check.resolve
    # The evidence's SIMULATED line, when its study was rehearsed on a simulated GPU host: a
    # check against it is a rehearsal too, and says so first
    simulated: str | None = None

    def resolve_of(self, objective: str) -> float:
        """The smallest change of ``objective`` a verdict must resolve (the study's
        check.resolve; 20 % in evidence written before it was recorded)."""
        return self.resolve.get(objective, DEFAULT_RESOLVE)

    @property
    def model_names(self) -> list[str]:
        """Names the deployment may serve the model under (served name, then its path)."""
        return [n for n in (self.served_model_name, self.model) if n]


def _typed(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} is not a mapping")
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def workload_from(data: Any, where: str = "evidence workload") -> WorkloadConfig:
    """A validated WorkloadConfig from its JSON form (``dataclasses.asdict`` of one)."""
    wl: WorkloadConfig = _typed(WorkloadConfig, data, where)
    classes = []
    for i, raw in enumerate(data.get("classes") or []):
        rc: RequestClass = _typed(RequestClass, raw, f"{where}.classes[{i}]")
        rc.prompt_tokens = _typed(LengthDist, raw.get("prompt_tokens") or {}, f"{where}[{i}]")
        rc.output_tokens = _typed(LengthDist, raw.get("output_tokens") or {}, f"{where}[{i}]")
        classes.append(rc)
    wl.classes = classes
    # the nested settings arrive as mappings: typed here, or their defaults where absent
    wl.prefix = _typed(PrefixConfig, data.get("prefix") or {}, f"{where}.prefix")
    wl.sessions = _typed(SessionConfig, data.get("sessions") or {}, f"{where}.sessions")
    trace = data.get("trace")
    wl.trace = None if trace is None else _typed(TraceConfig, trace, f"{where}.trace")
    wl.validate()
    return wl


def _noise(data: Any) -> NoiseEstimate:
    rel_sd, df = (data or {}).get("rel_sd"), int((data or {}).get("df") or 0)
    value = float(rel_sd) if rel_sd is not None else math.nan
    return NoiseEstimate(value, df if math.isfinite(value) else 0)


def read_reference(path: Path) -> Reference:
    """The evidence file at ``path``, typed; ConfigError when it is not one `check` can use."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --evidence {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"--evidence {path} is not JSON: {exc}") from None
    check = data.get("check") if isinstance(data, dict) else None
    if not isinstance(check, dict) or not data.get("workload"):
        raise ConfigError(
            f"--evidence {path} has no check block or workload",
            hint="export the study again with this tuner version (tuner export STUDY)",
        )
    slo: SloConfig = _typed(SloConfig, data.get("slo") or {}, "evidence slo")
    cost: CostConfig = _typed(CostConfig, check.get("cost") or {}, "evidence cost")
    context = ObjectiveContext(
        cost=cost,
        slo=slo,
        device=str(check.get("device") or "cpu"),
        cpus=int(check.get("cpus") or 0),
        gpus_used=int(check.get("gpus") or 0),
        gpu_model=str(check.get("gpu_model") or ""),
    )
    objectives = {str(k): str(v) for k, v in (check.get("objectives") or {}).items()}
    if not objectives:
        raise ConfigError(f"--evidence {path} names no objective")
    model, samples = check.get("model") or {}, check.get("samples") or {}
    return Reference(
        path=path,
        study=str(data.get("study") or "?"),
        choice=str(data.get("choice") or "?"),
        simulated=data.get("simulated") or None,
        model=str(model.get("model") or ""),
        model_sha256=str(model.get("config_sha256") or ""),
        served_model_name=check.get("served_model_name"),
        workload=workload_from(data["workload"]),
        slo=slo,
        scoring=Scoring(objectives, [str(c) for c in check.get("constraints") or []], context),
        samples={n: [float(v) for v in samples.get(n) or []] for n in objectives},
        noise={n: _noise((check.get("noise") or {}).get(n)) for n in objectives},
        min_gain=float(check.get("min_gain") or 0.0),
        resolve=_resolve(check.get("resolve"), objectives, path),
    )


def _resolve(data: Any, objectives: dict[str, str], path: Path) -> dict[str, float]:
    """Each objective's check.resolve from the evidence, validated like the study's config."""
    if data is None:
        return {}
    try:
        resolve = {str(k): float(v) for k, v in dict(data).items() if k in objectives}
    except (TypeError, ValueError):
        where = f"--evidence {path}: check.resolve"
        raise ConfigError(f"{where} is not a mapping of fractions") from None
    for name, value in resolve.items():
        if not 0 < value < 1:
            raise ConfigError(
                f"--evidence {path}: check.resolve of {name} must be in (0, 1), got {value}"
            )
    return resolve


def tokenizer_for(reference: Reference, given: Path | None) -> str:
    """The local folder whose tokenizer synthesizes the prompts: ``given``, else the study's
    model path; refused when its config.json is not the evidence's model."""
    folder = given or Path(reference.model)
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"no model folder at {folder} to take the tokenizer from",
            hint="pass --tokenizer with a local copy of the evidence's model",
        )
    digest = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:16]
    if reference.model_sha256 and digest != reference.model_sha256:
        raise ConfigError(
            f"{folder} is another model than the evidence's {reference.model} "
            "(its config.json differs)",
            hint="check the deployment against evidence of the model it serves",
        )
    return str(folder)
