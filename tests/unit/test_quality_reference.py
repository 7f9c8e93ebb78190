"""The quality gate's reference travels with the study storage, not with a trial folder.

A baseline is measured once per fingerprint and reused by later studies in the same storage,
perhaps on another host or after ``studies/`` was cleaned. Its quality outputs are the gate's
reference: a later study must score its gated trials against them, not mark every gated trial
infeasible because the baseline's folder is gone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from tests.fakes.quality_items import out, run
from tuner.config import TunerConfig
from tuner.paths import TrialPaths
from tuner.quality import load_items
from tuner.schema import Role, TrialAttr, stage_study
from tuner.search.resolved import ResolvedLaunch
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.runner import StudyRunner
from tuner.testing.grid_table import DEFAULTS, GROUPS, PARAMS, write_table
from tuner.testing.landscape import Landscape
from tuner.testing.lookup import (
    StudyStrategy,
    base_config,
    categorical_space,
    lookup_trials,
    study_config,
)
from tuner.trial.outcome import TrialOutcome

GATED = "first"


def _config(land: Any, name: str, folder: Path, storage: str) -> TunerConfig:
    strategy = StudyStrategy("q", "staged", "random", 2, repeats=0, baseline_measurements=1)
    space = categorical_space(land, GROUPS)
    config: TunerConfig = study_config(base_config(), strategy, space, 2.6, 0, folder)
    config.name, config.study.storage, config.study.stages = name, storage, [GATED]
    config.quality.enabled, config.quality.stages = True, [GATED]
    config.quality.metrics = ["token_agreement"]
    return config


def _with_quality(lookup: Any) -> Any:
    """The table's measurement plus quality outputs written to the trial folder, as a real
    trial writes them; every server answers the same tokens (no drop)."""

    def trial(
        config: TunerConfig, launch: ResolvedLaunch, paths: TrialPaths, trial_id: str, **kw: Any
    ) -> TrialOutcome:
        outcome: TrialOutcome = lookup(config, launch, paths, trial_id, **kw)
        outputs = run(*(out(i, [1, 2, 3, 4], "x") for i in load_items(config.quality.prompts)))
        outputs.write(paths.ensure().root / "quality.jsonl")
        outcome.quality = outputs.summary()
        return outcome

    return trial


def _run(config: TunerConfig, land: Any) -> list[str]:
    said: list[str] = []
    lookup = lookup_trials(land, np.random.default_rng(0), [])
    StudyRunner(
        config, Evaluator(config), {"t": 1}, said.append, trial_fn=_with_quality(lookup)
    ).run()
    return said


def test_a_later_study_scores_against_the_stored_reference_without_the_baseline_folder(
    tmp_path: Path,
) -> None:
    land = Landscape.from_csv(write_table(tmp_path / "grid.csv"), PARAMS, DEFAULTS)
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    first = _config(land, "first-study", tmp_path / "a", storage)
    _run(first, land)
    shutil.rmtree(tmp_path / "a")  # the baseline's trial folder, its quality.jsonl with it

    second = _config(land, "second-study", tmp_path / "b", storage)
    said = _run(second, land)
    assert any("reusing trial" in line for line in said), said  # the same stored baseline
    study = optuna.load_study(study_name=stage_study(second.name, GATED), storage=storage)
    gated = [t for t in study.trials if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH]
    assert gated
    for t in gated:
        assert t.user_attrs[TrialAttr.QUALITY_GATED] is True
        assert t.user_attrs[TrialAttr.QUALITY_DROPS] == {"token_agreement": 0.0}
        assert "no baseline outputs" not in t.user_attrs[TrialAttr.QUALITY_NOTE]
        assert t.user_attrs["q_token_agreement"] == 1.0  # scored against the reference
