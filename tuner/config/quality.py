"""The ``quality`` group: the quality gate's prompt set, metrics and tolerances.

``conf/quality/`` holds the default prompt set (JSONL), not YAML presets: the section's values
are these defaults, a study preset's or an override such as ``quality.tolerance=0.05``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.errors import ConfigError


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
