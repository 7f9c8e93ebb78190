"""Scores of a quality run against the baseline's run, and the gate's margins.

Agreement metrics compare a run with the baseline's run item by item (a baseline agrees with
itself, so its reference value is 1); absolute metrics are computed on each run alone and the
baseline's own value is the reference. An item the candidate failed scores 0 everywhere; an item
the baseline failed (or asked differently) is left out of the agreement metrics.

- ``exact_match_rate``: fraction of items whose tokens are identical.
- ``prefix_agreement``: mean of (tokens before the first divergence) / (longer length).
- ``token_agreement``: mean of (position-wise equal tokens) / (longer length).
- ``long_input_consistency``: ``token_agreement`` over the long inputs only.
- ``format_compliance``: fraction of items with a ``format`` whose output has it.
- ``accuracy``: fraction of items with a ``reference`` whose output matches it.

Tokens are the ids vLLM returned; if either run lacks them, characters of the text are compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config import ParamSpec, QualityConfig
from tuner.errors import ArtifactError, ConfigError
from tuner.quality.collect import QualityOutput, QualityOutputs
from tuner.quality.items import QualityItem, format_ok, is_correct, load_items
from tuner.quality.result import (
    AGREEMENT_METRICS,
    GATE_METRICS,
    ItemScore,
    QualityResult,
    QualityScores,
)


def agreement(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> tuple[float, float]:
    """(prefix agreement, position-wise agreement) of two token sequences, each in [0, 1]."""
    x, y = np.asarray(a), np.asarray(b)
    longest, shortest = max(len(x), len(y)), min(len(x), len(y))
    if longest == 0:
        return 1.0, 1.0
    equal = x[:shortest] == y[:shortest]
    prefix = shortest if bool(equal.all()) else int(np.argmin(equal))
    return prefix / longest, float(np.count_nonzero(equal)) / longest


def _token_pair(a: QualityOutput, b: QualityOutput) -> tuple[np.ndarray, np.ndarray]:
    if a.token_ids is not None and b.token_ids is not None:
        return np.asarray(a.token_ids, dtype=np.int64), np.asarray(b.token_ids, dtype=np.int64)
    return _chars(a.text), _chars(b.text)


def _chars(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def score_item(
    item: QualityItem,
    out: QualityOutput | None,
    base: QualityOutput | None,
    long_input_tokens: int = 0,
) -> ItemScore:
    """Score one item's output against the baseline's (``base``: None = no baseline)."""
    ok = out is not None and out.ok and out.digest == item.digest
    text = out.text if (ok and out is not None) else ""
    lengths = [o.prompt_tokens or 0 for o in (out, base) if o is not None]
    long = item.long or (long_input_tokens > 0 and max(lengths, default=0) >= long_input_tokens)
    s = ItemScore(item.id, ok, long)
    if item.format:
        s.format_ok = ok and bool(format_ok(text, item))
    if item.reference:
        s.correct = ok and bool(is_correct(text, item))
    if base is not None and _comparable(item, out, base):
        # A failed answer agrees with nothing.
        pair = _token_pair(out, base) if (ok and out is not None) else None
        prefix, tokens = agreement(*pair) if pair else (0.0, 0.0)
        s.prefix_agreement, s.token_agreement, s.exact = prefix, tokens, prefix == 1.0
    return s


def _comparable(item: QualityItem, out: QualityOutput | None, base: QualityOutput) -> bool:
    """The baseline answered this very prompt, with the candidate's generation settings."""
    if not base.ok or base.digest != item.digest:
        return False
    return out is None or not out.settings or not base.settings or out.settings == base.settings


def score(
    outputs: QualityOutputs,
    baseline: QualityOutputs | None,
    items: Sequence[QualityItem],
    long_input_tokens: int = 0,
) -> QualityScores:
    """The metrics of ``outputs`` (against ``baseline`` when given) over ``items``."""
    mine, theirs = outputs.by_id(), baseline.by_id() if baseline else {}
    per = [score_item(i, mine.get(i.id), theirs.get(i.id), long_input_tokens) for i in items]
    return QualityScores(
        items=len(per),
        errors=sum(not s.ok for s in per),
        compared=sum(s.token_agreement is not None for s in per),
        exact_match_rate=_mean([s.exact for s in per]),
        prefix_agreement=_mean([s.prefix_agreement for s in per]),
        token_agreement=_mean([s.token_agreement for s in per]),
        long_input_consistency=_mean([s.token_agreement for s in per if s.long]),
        format_compliance=_mean([s.format_ok for s in per]),
        accuracy=_mean([s.correct for s in per]),
        per_item=per,
    )


def _mean(values: Sequence[float | bool | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(np.mean(present)) if present else None


# -- the gate ------------------------------------------------------------------------------


def drops(
    candidate: QualityScores, baseline_self: QualityScores, metrics: Sequence[str]
) -> dict[str, float]:
    """baseline - candidate per metric that both runs have (agreement metrics: 1 - candidate)."""
    out: dict[str, float] = {}
    for name in metrics:
        ref = 1.0 if name in AGREEMENT_METRICS else baseline_self.metric(name)
        value = candidate.metric(name)
        if ref is not None and value is not None:
            out[name] = ref - value
    return out


def gate_applies(qcfg: QualityConfig, stage: str, specs: Mapping[str, ParamSpec]) -> bool:
    """Whether trials of ``stage`` (searching ``specs``) must pass the quality gate."""
    touched = {key for key in specs} | {s.name for s in specs.values() if s.name}
    return qcfg.enabled and (stage in qcfg.stages or bool(touched & set(qcfg.precision_params)))


def check_config(qcfg: QualityConfig) -> list[QualityItem]:
    """Check the config and the quality set at study set-up; returns the items ([] if off)."""
    qcfg.validate()
    unknown = [m for m in [*qcfg.metrics, *qcfg.tolerances] if m not in GATE_METRICS]
    if unknown:
        raise ConfigError(
            f"quality: unknown metric(s) {', '.join(unknown)}",
            hint=f"known: {', '.join(GATE_METRICS)}",
        )
    return load_items(qcfg.prompts) if qcfg.enabled else []


def quality_fingerprint(qcfg: QualityConfig) -> dict[str, Any] | None:
    """What a baseline's quality outputs depend on; part of the baseline's fingerprint, so that
    a baseline measured with another quality set (or none) is not reused as the reference."""
    if not qcfg.enabled:
        return None
    items = load_items(qcfg.prompts)
    digests = "".join(f"{i.id}={i.digest};" for i in items).encode()
    return {
        "set": hashlib.sha256(digests).hexdigest()[:16],
        "items": len(items),
        "max_tokens": qcfg.max_tokens,
        "ignore_eos": qcfg.ignore_eos,
    }


def attach_quality(
    trial_quality: QualityResult,
    baseline: QualityOutputs | None,
    qcfg: QualityConfig,
    applies: bool,
) -> QualityResult:
    """A trial's quality run scored against the baseline's: scores, drops and margins.

    ``baseline`` is the baseline's reference outputs, as the study storage keeps them (a
    resumed study, or one on another host, has them without the baseline's trial folder).
    ``excess`` (drop - tolerance, per gated metric) is what the ``quality_vs_baseline``
    constraint reads; it is empty when there is nothing to compare (no outputs, no baseline),
    which that constraint treats as violated when the gate applies.
    """
    result = replace(
        trial_quality,
        applies=applies,
        drops={},
        excess={},
        tolerances={m: qcfg.tolerance_for(m) for m in qcfg.metrics},
        baseline_items=len(baseline.rows) if baseline else 0,
    )
    if not trial_quality.outputs:
        return replace(result, note="this trial ran no quality set")
    try:
        items = load_items(qcfg.prompts)
        cand = QualityOutputs.read(Path(trial_quality.outputs))
    except (ArtifactError, ConfigError) as exc:
        return replace(result, note=exc.one_line())
    return _scored(result, cand, baseline, items, qcfg)


def _scored(
    result: QualityResult,
    cand: QualityOutputs,
    base: QualityOutputs | None,
    items: list[QualityItem],
    qcfg: QualityConfig,
) -> QualityResult:
    scores = score(cand, base, items, qcfg.long_input_tokens)
    if base is None:
        return replace(result, scores=scores, note="no baseline outputs to compare with")
    base_self = score(base, base, items, qcfg.long_input_tokens)
    d = drops(scores, base_self, qcfg.metrics)
    excess = {m: v - qcfg.tolerance_for(m) for m, v in d.items()}
    return replace(result, scores=scores, baseline_scores=base_self, drops=d, excess=excess)
