"""The ``objectives`` group: what a study optimises and which constraints a trial must meet.

The ``slo`` section sits here too. It is a top-level key (``slo.p99_ttft_s``, set by the study
presets beside the workload it belongs to), not a group of its own, but it exists for the
objectives: the ``slo_p99_*`` constraints this group names are checked against it, and the plan's
sizing reads the same bounds.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import ConfigError

CLASS_SLO_METRICS = ("e2e", "ttft", "tpot")  # what an SLO of one request class may bound


@dataclass
class ClassSloConfig:
    """One request class's own SLOs, in seconds (0 = not set): a chat turn needs its first
    token fast, a document summary can wait. Each set one is a constraint of its own.
    ``max_rejected_rate`` bounds the share of the class's requests refused as too long for the
    server's context (None = not set: only slo.max_rejected_rate over every request; 0 is a
    bound, none allowed)."""

    p99_e2e_s: float = 0.0
    p99_ttft_s: float = 0.0
    p99_tpot_s: float = 0.0
    max_rejected_rate: float | None = None

    def limits(self) -> dict[str, float]:
        """The set ones, by metric (e2e, ttft, tpot)."""
        values = {m: float(getattr(self, f"p99_{m}_s")) for m in CLASS_SLO_METRICS}
        return {m: v for m, v in values.items() if v > 0}


@dataclass
class SloConfig:
    """Service-level objectives, in seconds (0 = not set). Used for goodput and constraints.
    ``classes`` sets SLOs for one request class of the workload (``slo.classes.chat.p99_ttft_s``)
    beside the ones over every request.

    ``max_rejected_rate`` is the share of the requests a server may refuse as longer than its
    context (its max_model_len, a tier cap): 0 allows none, so a cap that turns requests away
    is infeasible unless the user sends a share of the traffic to another tier (0.25: a
    quarter; ``slo.classes.<class>.max_rejected_rate`` bounds one class, beside this one).
    Rejected requests are not errors: max_error_rate is over the requests the server took."""

    p99_e2e_s: float = 0.0
    p99_ttft_s: float = 0.0
    p99_tpot_s: float = 0.0
    max_error_rate: float = 0.01
    max_rejected_rate: float = 0.0
    # class -> {p99_ttft_s: ..., ...}: plain mappings, so that one override sets one
    # (``+slo.classes.chat.p99_ttft_s=0.5``); :meth:`class_slo` reads one as its type
    classes: dict[str, dict[str, float]] = field(default_factory=dict)

    def class_slo(self, name: str) -> ClassSloConfig:
        """The SLOs of request class ``name`` (none set: every one 0)."""
        return _class_slo(name, self.classes.get(name) or {})

    def class_limits(self) -> list[tuple[str, str, float]]:
        """Every set class SLO as (class, metric, limit in seconds)."""
        return [
            (name, metric, limit)
            for name in sorted(self.classes)
            for metric, limit in self.class_slo(name).limits().items()
        ]

    def class_rejected_limits(self) -> list[tuple[str, float]]:
        """Every set class bound on rejected requests as (class, max_rejected_rate)."""
        found = [(name, self.class_slo(name).max_rejected_rate) for name in sorted(self.classes)]
        return [(name, float(limit)) for name, limit in found if limit is not None]

    def validate(self, known: Collection[str]) -> None:
        """The rates are shares, and every class SLO names a class of the workload."""
        _check_share("slo.max_rejected_rate", self.max_rejected_rate)
        self.check_classes(known)

    def check_classes(self, known: Collection[str]) -> None:
        """A class SLO names a class of the workload, and its limits are not negative."""
        for name in self.classes:
            slo = self.class_slo(name)
            if name not in known:
                raise ConfigError(
                    f"slo.classes.{name} names a request class the workload does not have "
                    f"(its classes: {', '.join(sorted(known)) or 'none'})",
                    hint="set the SLO on one of those, or add the class to workload.classes",
                )
            if any(getattr(slo, f"p99_{m}_s") < 0 for m in CLASS_SLO_METRICS):
                raise ConfigError(f"slo.classes.{name}: an SLO must be >= 0 seconds (0: not set)")
            if slo.max_rejected_rate is not None:
                _check_share(f"slo.classes.{name}.max_rejected_rate", slo.max_rejected_rate)


def _check_share(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(
            f"{key}={value!r} is not a share of the requests: it must be in [0, 1]",
            hint="0 allows no rejected request, 1 allows every one",
        )


def _class_slo(name: str, data: Any) -> ClassSloConfig:
    try:
        return ClassSloConfig(**dict(data))
    except TypeError as exc:
        raise ConfigError(f"slo.classes.{name}: {exc}") from None


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
            "rejected_rate",
            "quality_vs_baseline",
        ]
    )
