"""Opening a run's studies in the storage, new or resumed.

A stored study is resumed only if it holds the objectives this run measures, in the same order
(mixing them would compare seconds with tokens per second), and the trials an interrupted run
left running are marked failed before anything is asked of it.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage

from tuner.errors import ConfigError
from tuner.schema import owns
from tuner.study.decision.evaluation import Evaluator
from tuner.study.state.storage import fail_unfinished_trials


def check_objectives(study: optuna.Study, names: list[str]) -> None:
    """Refuse a stored study whose values are of other objectives, or in another order:
    mixing them with this run's would compare seconds with tokens per second."""
    if study.metric_names and study.metric_names != names:
        raise ConfigError(
            f"storage study {study.study_name!r} holds objectives "
            f"{', '.join(study.metric_names)}; this run measures "
            f"{', '.join(names)}",
            hint="resume it with the objectives it was started with, or give this run a new name=",
        )


def check_resumed(storage: BaseStorage, name: str, names: list[str]) -> None:
    """Check the stored stages of study ``name`` before the first launch, not after a
    baseline."""
    for stored in optuna.get_all_study_names(storage):
        if owns(name, stored):
            check_objectives(optuna.load_study(study_name=stored, storage=storage), names)


def open_study(
    storage: optuna.storages.RDBStorage,
    name: str,
    evaluator: Evaluator,
    sampler: BaseSampler | None,
    exclusive: bool,
    say: Callable[[str], None],
) -> optuna.Study:
    """The study ``name``, created or resumed, its interrupted trials marked failed."""
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        directions=evaluator.directions,
        sampler=sampler,
        load_if_exists=True,
    )
    if not study.metric_names:
        study.set_metric_names(evaluator.names)
    check_objectives(study, evaluator.names)
    interrupted = fail_unfinished_trials(storage, study, exclusive=exclusive)
    if interrupted:
        say(f"{name}: {interrupted} interrupted trial(s) marked failed; resuming")
    return study
