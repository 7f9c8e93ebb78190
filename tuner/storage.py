"""The study database: Optuna's RDB storage through a SQLAlchemy URL.

Default: SQLite in studies/<name>/optuna.db; any SQLAlchemy URL (PostgreSQL for several workers)
may replace it. Errors are translated to StorageError with the password hidden.
"""

from __future__ import annotations

from typing import Any

import optuna
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from tuner.errors import ConfigError, StorageError

ATTR_INTERRUPTED = "interrupted"


def redact_url(url: str) -> str:
    """The URL with its password replaced by ***, for logs and messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable storage URL>"


def check_url(url: str) -> None:
    """A ConfigError unless ``url`` parses as a SQLAlchemy URL (no connection is made)."""
    try:
        make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"study.storage is not a SQLAlchemy URL: {redact_url(url)}",
            hint="e.g. sqlite:///studies/x/optuna.db or postgresql+psycopg://user@host/db",
        ) from exc


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Open (and create the schema of) the study database at ``url``."""
    check_url(url)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}  # survive a restarted database
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(
            f"cannot open the study storage {redact_url(url)}: {first}",
            hint="check that the database server runs and the URL, user and driver are right",
        ) from exc


def fail_unfinished_trials(study: optuna.Study) -> int:
    """Mark trials left RUNNING by an interrupted or crashed run as FAIL (interrupted).

    One runner per study is assumed (the run lock in studies/<name>/ enforces it), so a RUNNING
    trial at start-up belongs to a run that is gone.
    """
    n = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(trial._trial_id, ATTR_INTERRUPTED, True)
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        n += 1
    return n
