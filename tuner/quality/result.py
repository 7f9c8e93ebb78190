"""A trial's quality record: its run of the quality set and, once scored, the gate's verdict.

The record travels in the trial outcome (result.json) and feeds three readers: the gate's
constraint (:func:`context_excess`), the dashboard's columns (:func:`quality_attrs`) and the
progress line (:func:`quality_line`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tuner.schema import TrialAttr, quality_attr

AGREEMENT_METRICS = (
    "exact_match_rate",
    "prefix_agreement",
    "token_agreement",
    "long_input_consistency",
)
ABSOLUTE_METRICS = ("format_compliance", "accuracy")
GATE_METRICS = (*AGREEMENT_METRICS, *ABSOLUTE_METRICS)


@dataclass
class ItemScore:
    """One item: None where a metric does not apply (no baseline, no format, no reference)."""

    id: str
    ok: bool
    long: bool
    exact: bool | None = None
    prefix_agreement: float | None = None
    token_agreement: float | None = None
    format_ok: bool | None = None
    correct: bool | None = None


@dataclass
class QualityScores:
    """The metrics of one run (see :mod:`tuner.quality.score`); None when no item bears on one."""

    items: int
    errors: int
    compared: int  # items with a usable baseline answer
    exact_match_rate: float | None = None
    prefix_agreement: float | None = None
    token_agreement: float | None = None
    long_input_consistency: float | None = None
    format_compliance: float | None = None
    accuracy: float | None = None
    per_item: list[ItemScore] = field(default_factory=list)

    def metric(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)

    def to_dict(self, per_item: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not per_item:
            data.pop("per_item")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QualityScores:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["per_item"] = [ItemScore(**i) for i in data.get("per_item") or []]
        return cls(**values)


@dataclass
class QualityResult:
    """What a trial's quality set gave, and how it compares with the baseline's answers."""

    outputs: str = ""  # the trial's own outputs file, quality.jsonl
    items: int = 0
    errors: int = 0
    first_error: str = ""
    seconds: float = 0.0
    applies: bool = False  # the gate judges this trial (a gated stage)
    tolerances: dict[str, float] = field(default_factory=dict)
    baseline_items: int = 0  # answers in the baseline's reference (0: none to compare)
    scores: QualityScores | None = None
    baseline_scores: QualityScores | None = None  # the baseline against itself
    drops: dict[str, float] = field(default_factory=dict)  # baseline - candidate, per metric
    excess: dict[str, float] = field(default_factory=dict)  # drop - tolerance (> 0: over)
    note: str = ""  # why there is nothing to compare, when there is not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QualityResult:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("scores", "baseline_scores"):
            if values.get(key) is not None:
                values[key] = QualityScores.from_dict(values[key])
        return cls(**values)


def context_excess(quality: QualityResult | None) -> dict[str, float] | None:
    """``ObjectiveContext.quality_excess`` for a trial: None when the gate does not apply."""
    if quality is None or not quality.applies:
        return None
    return dict(quality.excess)


def quality_attrs(quality: QualityResult | None) -> dict[str, Any]:
    """Flat Optuna user attrs (dashboard columns): q_<metric>, drops, whether gated."""
    if quality is None:
        return {}
    attrs: dict[str, Any] = {
        TrialAttr.QUALITY_GATED: quality.applies,
        TrialAttr.QUALITY_ERRORS: quality.errors,
        TrialAttr.QUALITY_DROPS: dict(quality.drops),
        TrialAttr.QUALITY_NOTE: quality.note,
        TrialAttr.QUALITY_OUTPUTS: quality.outputs,
    }
    scores = quality.scores
    if scores is not None:
        for m in GATE_METRICS:
            value = scores.metric(m)
            if value is not None:
                attrs[quality_attr(m)] = value
    return attrs


def quality_line(quality: QualityResult | None) -> str:
    """One progress/report line: the worst gated drop against its tolerance."""
    if quality is None:
        return "quality: not measured"
    agree = quality.scores.token_agreement if quality.scores else None
    head = f"quality: {quality.items} prompts, {quality.errors} errors"
    head += f", token agreement {agree:.3f}" if agree is not None else ""
    excess = quality.excess
    if not excess:
        note = quality.note or "nothing to compare"
        return f"{head}; {'GATE HAS NO DATA: ' if quality.applies else ''}{note}"
    worst = max(excess, key=lambda m: excess[m])
    drop, tol = quality.drops[worst], quality.tolerances.get(worst, 0.0)
    verdict = "within" if excess[worst] <= 0 else "OVER"
    gated = "gated" if quality.applies else "not gated here"
    return f"{head}; worst drop {worst} {drop:.3f} {verdict} tolerance {tol:.3f} ({gated})"
