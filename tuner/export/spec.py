"""What one deployed server needs, read from a stored study: model, flags, environment, devices.

Both the file exporters (:mod:`tuner.export.serve`) and the Kubernetes manifests
(:mod:`tuner.export.k8s`) render a :class:`ServeSpec`; it is built once from the study's fixed
server args with the chosen params on top, turned into flags and environment by
:func:`tuner.search.space.to_launch` exactly as the study launched them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.config import ServerConfig
from tuner.errors import ConfigError
from tuner.redact import is_secret_name
from tuner.review.stored import Choice, Review
from tuner.search import space as search_space
from tuner.search.resolved import args_to_argv, resolve_params

SERVE_HOST, SERVE_PORT = "0.0.0.0", 8000
CONTAINER_MODEL_DIR = "/models"
GPU_IMAGE = "vllm/vllm-openai:v{version}"
CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{version}"
EVIDENCE_FILE = "evidence.json"
# Flags a deployment sets itself; the study's values (loopback, a random port) do not carry over.
DEPLOYMENT_ARGS = ("host", "port", "model", "served_model_name", "api_key")
_VERSION_RE = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


@dataclass
class ServeSpec:
    """What the server needs: model, flags (name -> value), environment, devices."""

    name: str
    model: str
    args: dict[str, Any]
    env: dict[str, str]
    device: str = "cpu"
    devices: int = 1
    vllm_version: str = ""
    launcher: list[str] = field(default_factory=lambda: ["vllm", "serve", "{model}"])
    served_model_name: str | None = None
    memory_mib: float | None = None  # the server's peak RSS in the study
    startup_s: float | None = None
    cpus: float | None = None  # CPU cores the study's server could use

    @property
    def local_model(self) -> bool:
        return self.model.startswith(("/", "./", "~"))

    @property
    def container_model(self) -> str:
        """The model as a container sees it: local folders are mounted under /models."""
        if not self.local_model:
            return self.model
        return f"{CONTAINER_MODEL_DIR}/{Path(self.model).name}"

    def flags(self, model: str | None = None, served_name: str | None = None) -> list[str]:
        """``--model M [--served-model-name N] --host H --port P`` + the tuned flags."""
        head: dict[str, Any] = {"model": model or self.model}
        if served_name or self.served_model_name:
            head["served_model_name"] = served_name or self.served_model_name
        head.update({"host": SERVE_HOST, "port": SERVE_PORT})
        return args_to_argv({**head, **self.args})

    def container_flags(self) -> list[str]:
        served = self.served_model_name or (Path(self.model).name if self.local_model else None)
        return self.flags(self.container_model, served)

    @property
    def image(self) -> str:
        """vLLM's image at the version the study measured ("vllm-cpu 0.32.0" -> v0.32.0)."""
        found = _VERSION_RE.search(self.vllm_version)
        template = GPU_IMAGE if self.device == "cuda" else CPU_IMAGE
        version = found.group(1) if found else None
        return template.format(version=version) if version else template.split(":v")[0] + ":latest"


def _deployable(arg: str) -> bool:
    """Flags the deployment sets itself, and secrets, are not copied from the study."""
    return arg not in DEPLOYMENT_ARGS and not is_secret_name(arg)


def build_serve_spec(review: Review, choice: Choice) -> ServeSpec:
    """The fixed server config of the study with ``choice``'s params applied."""
    server = review.config.get("server") or {}
    if not server.get("model"):
        raise ConfigError(
            f"{review.paths.config_yaml} is missing or has no server.model",
            hint="export needs the study folder written by `tuner run`: pass --studies-dir",
        )
    specs = search_space.flatten(review.config.get("search_space") or {})
    # the stored server as far as the merge reads it: its fixed args
    fixed = ServerConfig(args=dict(server.get("args") or {}))
    launch = resolve_params(choice.params, specs, fixed)
    args = launch.flags
    env = {**(server.get("env") or {}), **launch.env}
    view = choice.trial
    process = (view.telemetry.get("process") or {}) if view else {}
    return ServeSpec(
        name=review.name,
        model=str(server["model"]),
        args={k: v for k, v in args.items() if v is not None and _deployable(k)},
        env={k: str(v) for k, v in env.items() if not is_secret_name(k)},
        device=review.device,
        devices=launch.devices,
        vllm_version=str(review.fingerprint.get("vllm") or ""),
        launcher=list(server.get("launcher") or ["vllm", "serve", "{model}"]),
        served_model_name=server.get("served_model_name"),
        memory_mib=process.get("server_rss_max_mib"),
        startup_s=(view.result.get("server") or {}).get("startup_s") if view else None,
        cpus=review.cores or None,
    )
