"""Checks of a search space against what it will run on: the visible devices (parallel sizes
that can never fit) and the server's own flags (params its parser does not accept)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from tuner.config import ParamSpec
from tuner.errors import ConfigError
from tuner.search.space import SpecLike, as_spec, choices_of

# vLLM arguments whose product is the number of devices one server occupies.
DEVICE_MULTIPLIERS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def _specs(specs: Mapping[str, SpecLike], group: str) -> dict[str, ParamSpec]:
    return {p: as_spec(s, f"{group}.{p}") for p, s in specs.items()}


def devices_needed(args: Mapping[str, Any]) -> int:
    """Devices one server occupies for these vLLM args: TP x PP x DP (missing = 1)."""
    return math.prod(int(args.get(name) or 1) for name in DEVICE_MULTIPLIERS)


def _values(spec: ParamSpec) -> list[int]:
    """The choices, or a range's extremes (enough to find values that can never fit)."""
    choices = choices_of(spec)
    return [int(v) for v in (choices or [spec.low or 1, spec.high or 1])]


def validate_against_devices(
    space: Mapping[str, Mapping[str, SpecLike]],
    device: str,
    device_count: int,
    fixed_args: Mapping[str, Any] | None = None,
) -> None:
    """Reject parallel-size values that cannot fit the visible devices whatever else is chosen."""
    fixed = dict(fixed_args or {})
    tuned = {
        (s.name or p): (f"{g}.{p}", _values(s))
        for g, specs in space.items()
        for p, s in _specs(specs, g).items()
        if s.target == "arg" and (s.name or p) in DEVICE_MULTIPLIERS
    }
    for arg, (where, values) in tuned.items():
        others = {n: min(v) for n, (_, v) in tuned.items() if n != arg}
        floor = devices_needed({**fixed, **others, arg: 1})
        too_big = [v for v in values if v * floor > device_count]
        if too_big:
            raise ConfigError(
                f"search_space.{where}: values {too_big} need more than the {device_count} "
                f"visible {device} devices",
                hint="remove them from choices or expose more devices",
            )


def unknown_params(
    space: Mapping[str, Mapping[str, SpecLike]], known_flags: Iterable[str]
) -> list[str]:
    """``group.param`` of arg-target params that the server's parser does not accept.

    ``known_flags`` are option strings ("--max-num-seqs"); both sides are compared in
    argument-name form (max_num_seqs), so the flag spelling stays the server's business.
    """
    known = {f.lstrip("-").replace("-", "_") for f in known_flags}
    return [
        f"{g}.{p}"
        for g, specs in space.items()
        for p, s in _specs(specs, g).items()
        if s.target == "arg" and (s.name or p) not in known
    ]
