"""The ``objectives`` group: what a study optimises and which constraints a trial must meet.

The ``slo`` section sits here too. It is a top-level key (``slo.p99_ttft_s``, set by the study
presets beside the workload it belongs to), not a group of its own, but it exists for the
objectives: the ``slo_p99_*`` constraints this group names are checked against it, and the plan's
sizing reads the same bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SloConfig:
    """Service-level objectives, in seconds (0 = not set). Used for goodput and constraints."""

    p99_e2e_s: float = 0.0
    p99_ttft_s: float = 0.0
    p99_tpot_s: float = 0.0
    max_error_rate: float = 0.01


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
