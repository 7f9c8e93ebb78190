"""The ``search_space`` group: tunable parameters as data, one YAML file per group of them.

A composed ``search_space`` maps a group (``batching``, ``memory_cpu``, ...) to its parameters,
each a :class:`ParamSpec`; :func:`param_spec` types the plain mappings OmegaConf leaves below the
first level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import ConfigError


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
