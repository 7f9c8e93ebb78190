"""Hydra composition: conf/ and the command line's overrides into a validated TunerConfig.

Hydra and OmegaConf are seen here and nowhere else: the composed DictConfig is converted once
into the typed :class:`~tuner.config.TunerConfig` (``OmegaConf.to_object``). The override
grammar is widened for users, not for Hydra: any vLLM flag or environment variable is set
without ``+``, a shell command line is a value as typed, and naming one deployment source
replaces the other a preset may set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.host.placement import for_trial


def default_config_dir() -> Path:
    """conf/ beside the package (editable install / repo checkout), else ./conf."""
    here = Path(__file__).resolve().parent.parent / "conf"
    return here if here.is_dir() else Path.cwd() / "conf"


# Open mappings: any vLLM flag or environment variable may be set without Hydra's `+` prefix.
OPEN_MAPPINGS = ("server.args.", "server.env.")


# Shell command lines as values: `=`, quotes and brackets would trip Hydra's override grammar.
VERBATIM = ("server.from_command=",)


def _verbatim(override: str) -> str:
    """``key=value`` with the value quoted for Hydra, unless the user quoted it already."""
    key, value = override.split("=", 1)
    if value[:1] in ("'", '"') or value == "null":  # null: no command (start from the args)
        return override
    # Hydra unescapes a backslash only before a quote or at the end: double exactly those.
    escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"{key}='{escaped}'"


# Where today's deployment comes from: one source at a time.
DEPLOYMENT_SOURCES = ("server.from_command", "server.from_config")


def _one_deployment_source(overrides: Sequence[str]) -> list[str]:
    """A source named on the command line replaces the other one a preset may set: the
    quickstart starts from a command, and `server.from_config=x.yaml` means start from x."""
    named = {o.split("=", 1)[0].lstrip("+") for o in overrides if "=" in o}
    given = [s for s in DEPLOYMENT_SOURCES if s in named]
    if len(given) != 1:  # neither, or both (which validation then rejects)
        return list(overrides)
    other = next(s for s in DEPLOYMENT_SOURCES if s not in given)
    return [f"{other}=null", *overrides]


def _open_mapping_overrides(overrides: Sequence[str]) -> list[str]:
    """`server.args.x=1` means add-or-replace (Hydra would demand `+` for a new key)."""
    quoted = [_verbatim(o) if o.startswith(VERBATIM) else o for o in overrides]
    return [f"++{o}" if o.startswith(OPEN_MAPPINGS) else o for o in _one_deployment_source(quoted)]


def compose(overrides: Sequence[str], config_dir: Path | None = None) -> TunerConfig:
    """Compose conf/ with Hydra overrides into a validated TunerConfig."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from tuner.config import register_configs

    register_configs()
    conf_dir = (config_dir or default_config_dir()).resolve()
    if not conf_dir.is_dir():
        raise ConfigError(f"config folder {conf_dir} does not exist", hint="pass --config-dir")
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=_open_mapping_overrides(overrides))
        config = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_hydra_message(exc), hint="see conf/ for the valid keys") from exc
    assert isinstance(config, TunerConfig)
    _resolve_local_paths(config)
    config.validate()
    from tuner.server.from_command import start_from_today

    if start_from_today(config.server, overrides):  # today's deployment: the fixed args
        _resolve_local_paths(config)
    for_trial(config)  # the placement must be possible on this host before anything starts
    from tuner.server import prepare_host

    prepare_host(config.server)  # e.g. a simulated host's GPUs, before anything looks at them
    return config


def _hydra_message(exc: BaseException) -> str:
    """Hydra's first line plus its cause's (e.g. "Key 'x' is not in struct"), no detail lines."""
    parts: list[str] = []
    while exc is not None and len(parts) < 2:
        lines = str(exc).strip().splitlines()
        if lines and lines[0] not in parts:
            parts.append(lines[0].rstrip("."))
        exc = exc.__cause__  # type: ignore[assignment]
    return ": ".join(parts) or "invalid configuration"


def _resolve_local_paths(config: TunerConfig) -> None:
    """Relative model/dataset paths are relative to where the user runs tuner."""
    model = Path(config.server.model).expanduser()
    if model.exists():
        config.server.model = str(model.resolve())
    tokenizer = Path(str(config.server.args.get("tokenizer") or "")).expanduser()
    if str(tokenizer) != "." and tokenizer.exists():  # vLLM's --tokenizer: a local folder
        config.server.args["tokenizer"] = str(tokenizer.resolve())
    if config.workload.dataset:
        config.workload.dataset = str(Path(config.workload.dataset).expanduser().resolve())
