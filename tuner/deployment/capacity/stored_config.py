"""A study's stored ``config.yaml`` back as a typed :class:`TunerConfig`.

``tuner run`` writes the composed config it ran (secrets removed) next to the storage; a command
that runs the study's server again (``tuner capacity``) rebuilds the dataclasses from it, field by
field, without Hydra: keys this version does not know are left out, missing ones keep their
defaults.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

from tuner.config import TunerConfig
from tuner.errors import ConfigError

T = TypeVar("T")


def _build(kind: Any, value: Any, where: str) -> Any:
    """``value`` as ``kind``: a dataclass from a mapping, a list of them, else as it is."""
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        return value if value is None else _build(options[0], value, where)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} in the stored config is not a mapping: {value!r}")
        return from_dict(kind, value, where)
    if origin is list and isinstance(value, list):
        (inner,) = typing.get_args(kind) or (Any,)
        return [_build(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """An instance of the dataclass ``cls`` from ``data`` (nested dataclasses included)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {
        name: _build(hints[name], value, f"{where}.{name}")
        for name, value in data.items()
        if name in known
    }
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"the stored {where} does not fit this version: {exc}") from exc


def stored_config(data: dict[str, Any], study: str) -> TunerConfig:
    """The study's run config; ConfigError when the study folder has none."""
    if not data.get("server"):
        raise ConfigError(
            f"study {study!r} has no stored config.yaml with a server",
            hint=(
                "capacity and export --measure run the study's server: "
                "pass the --studies-dir `tuner run` used"
            ),
        )
    config = from_dict(TunerConfig, data)
    config.server.api_key = None  # stored without it: a fresh key per launch
    from tuner.server import prepare_host

    prepare_host(config.server)
    return config
