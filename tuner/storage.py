"""The study database: Optuna's RDB storage through a SQLAlchemy URL.

Default: SQLite in studies/<name>/optuna.db; any SQLAlchemy URL (PostgreSQL for several workers)
may replace it. Errors are translated to StorageError with the password hidden.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import optuna
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from tuner.errors import ConfigError, StorageError

ATTR_INTERRUPTED = "interrupted"
# On every stage study: the baseline study and trial its incumbent chain started from.
ATTR_BASELINE_STUDY, ATTR_BASELINE_TRIAL = "baseline_study", "baseline_trial"
# A running trial records a heartbeat; one silent for GRACE_S belongs to a dead worker.
HEARTBEAT_S = 20
GRACE_S = 90


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
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
        )
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(
            f"cannot open the study storage {redact_url(url)}: {first}",
            hint="check that the database server runs and the URL, user and driver are right",
        ) from exc


def fail_unfinished_trials(study: optuna.Study, exclusive: bool) -> int:
    """Mark trials left RUNNING by an interrupted or crashed run as FAIL (interrupted).

    ``exclusive``: this process holds the study's run lock on a local database, so every
    RUNNING trial belongs to a run that is gone. Otherwise (a shared server such as PostgreSQL,
    maybe other workers) only trials whose heartbeat went silent for GRACE_S are failed.
    """
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    storage = study._storage
    stale = set(running_ids := [t._trial_id for t in running])
    rdb = _rdb(storage)
    if not exclusive and rdb is not None:
        stale = set(rdb._get_stale_trial_ids(study._study_id)) & set(running_ids)
    for trial_id in stale:
        storage.set_trial_user_attr(trial_id, ATTR_INTERRUPTED, True)
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    return len(stale)


def _rdb(storage: object) -> optuna.storages.RDBStorage | None:
    """The RDB storage behind Optuna's cache wrapper, if any."""
    inner = getattr(storage, "_backend", storage)
    return inner if isinstance(inner, optuna.storages.RDBStorage) else None


class Heartbeat:
    """Records a trial's heartbeat every HEARTBEAT_S while a (long) trial runs."""

    def __init__(self, study: optuna.Study, trial_id: int) -> None:
        self._storage = _rdb(study._storage)
        self._trial_id = trial_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trial-heartbeat", daemon=True)

    def _beat(self) -> None:
        storage = self._storage
        assert storage is not None
        while True:
            with contextlib.suppress(SQLAlchemyError):  # a database blip must not kill a trial
                storage.record_heartbeat(self._trial_id)
            if self._stop.wait(HEARTBEAT_S):
                return

    def __enter__(self) -> Heartbeat:
        if self._storage is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
