"""The quality gate's reference in a study: the baseline's own outputs, and each trial's
quality scored against them (the input of the ``quality_vs_baseline`` constraint).

The reference travels with the storage (a baseline trial's ``quality_reference`` attr), so a
study resumed on another host, or after studies/ was cleaned, still has it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tuner.config import TunerConfig
from tuner.paths import StudyPaths
from tuner.quality import QualityOutputs, attach_quality, gate_applies, quality_line
from tuner.schema import Role, TrialAttr, confirm_label
from tuner.study.decision.stages import Stage
from tuner.trial.outcome import TrialOutcome


class QualityReference:
    """The baseline's quality outputs, and the scoring of every later trial against them."""

    def __init__(
        self,
        config: TunerConfig,
        stages: list[Stage],
        paths: StudyPaths,
        say: Callable[[str], None],
    ) -> None:
        self.config, self.stages, self.paths, self.say = config, stages, paths, say
        self.outputs: QualityOutputs | None = None

    def reuse(self, trial: optuna.trial.FrozenTrial) -> None:
        """A stored baseline's reference; a baseline stored before the reference moved into the
        storage still has its outputs file, when its folder is there."""
        records = trial.user_attrs.get(TrialAttr.QUALITY_REFERENCE)
        if records:
            self.outputs = QualityOutputs.from_records(records)
            return
        path = trial.user_attrs.get(TrialAttr.QUALITY_OUTPUTS)
        self.outputs = QualityOutputs.read(Path(path)) if path and Path(path).is_file() else None

    def score(self, outcome: TrialOutcome, label: str, role: str, prefix: str) -> None:
        """Score the trial's quality outputs against the baseline's (the gate's input)."""
        q = self.config.quality
        if not (q.enabled and outcome.ok) or outcome.quality is None:
            return
        if role == Role.BASELINE and outcome.quality.outputs:
            self.outputs = QualityOutputs.read(Path(outcome.quality.outputs))
        stage = next((s for s in self.stages if label in (s.name, confirm_label(s.name))), None)
        gated = stage is not None and gate_applies(q, stage.name, stage.specs)
        outcome.quality = attach_quality(outcome.quality, self.outputs, q, gated)
        outcome.write(self.paths.trial(outcome.trial_id).ensure().result_json)
        self.say(f"{prefix} {quality_line(outcome.quality)}")

    def attrs(self, role: str) -> dict[str, Any]:
        """A baseline trial keeps the reference in the storage."""
        if role == Role.BASELINE and self.outputs is not None:
            return {TrialAttr.QUALITY_REFERENCE: self.outputs.to_records()}
        return {}
