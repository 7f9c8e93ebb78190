"""Builders of quality-gate items and outputs for the unit tests of tuner.quality."""

from __future__ import annotations

from tuner.quality import QualityItem, QualityOutput, QualityOutputs


def item(id: str = "a", **kw: object) -> QualityItem:
    return QualityItem(id=id, prompt=str(kw.pop("prompt", f"prompt {id}")), **kw)  # type: ignore[arg-type]


def out(it: QualityItem, tokens: list[int] | None, text: str = "", **kw: object) -> QualityOutput:
    return QualityOutput(it.id, it.digest, text=text, token_ids=tokens, **kw)  # type: ignore[arg-type]


def run(*rows: QualityOutput) -> QualityOutputs:
    return QualityOutputs(list(rows))
