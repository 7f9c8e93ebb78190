"""The study database: Optuna's RDB storage through a SQLAlchemy URL.

Default: SQLite in studies/<name>/optuna.db; any SQLAlchemy URL (PostgreSQL for several workers)
may replace it. Errors are translated to StorageError with the password hidden.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from typing import Any

import optuna
from optuna.storages import BaseStorage
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from tuner.errors import ConfigError, StorageError
from tuner.schema import TrialAttr

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


def _sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    """SQLite in write-ahead-log mode: a commit appends to the log rather than rewriting and
    syncing the database file (a trial writes ~80 attributes, each its own commit: 3x faster
    here), and optuna-dashboard reads while the study writes instead of waiting on its locks.
    ``synchronous=NORMAL`` in WAL mode keeps every commit through a crash or kill of the
    process; only a power loss may drop the last ones."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Open (and create the schema of) the study database at ``url``."""
    check_url(url)
    # On the Engine class, not the storage's engine: RDBStorage builds its engine and connects
    # (the schema) inside its constructor, before a listener could be added to that engine.
    if make_url(url).get_backend_name() == "sqlite" and not event.contains(
        Engine, "connect", _sqlite_wal
    ):
        event.listen(Engine, "connect", _sqlite_wal)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}  # survive a restarted database
    try:
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
        )
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise storage_error("open the study storage", url, exc) from exc


def storage_error(what: str, url: str, exc: BaseException) -> StorageError:
    """A database error as one line: what could not be done, where (password hidden), why."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StorageError(
        f"cannot {what} {redact_url(url)}: {first}",
        hint="check that the database server runs and the URL, user and driver are right",
    )


def study_id(storage: BaseStorage, study: optuna.Study) -> int:
    """The storage's id of ``study`` (optuna-dashboard's URLs use it)."""
    return storage.get_study_id_from_name(study.study_name)


def trial_id(storage: BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial ``number`` of ``study`` (heartbeats and attrs are keyed by it)."""
    return storage.get_trial_id_from_study_id_trial_number(study_id(storage, study), number)


def fail_unfinished_trials(
    storage: optuna.storages.RDBStorage, study: optuna.Study, exclusive: bool
) -> int:
    """Mark trials left RUNNING by an interrupted or crashed run as FAIL.

    ``exclusive``: this process holds the study's run lock on a local database, so every
    RUNNING trial belongs to a run that is gone; each is marked ``interrupted`` and failed.
    Otherwise (a shared server such as PostgreSQL, maybe other workers) only trials whose
    heartbeat went silent for the storage's grace period are failed, by Optuna's own
    :func:`optuna.storages.fail_stale_trials`.
    """
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not exclusive:
        optuna.storages.fail_stale_trials(study)
        still = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        return len(running) - len(still)
    for trial in running:
        tid = trial_id(storage, study, trial.number)
        storage.set_trial_user_attr(tid, TrialAttr.INTERRUPTED, True)
        storage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL)
    return len(running)


class Heartbeat:
    """Records a trial's heartbeat every HEARTBEAT_S while a (long) trial runs.

    Optuna beats only inside ``Study.optimize``; a study driven by ask and tell (as this one is,
    to tell reused measurements and confirmations apart) beats for itself, so that another
    worker can tell a live trial from one whose process died.
    """

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int) -> None:
        self._storage = storage
        self._id = trial_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trial-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(SQLAlchemyError):  # a database blip must not kill a trial
                self._storage.record_heartbeat(self._id)
            if self._stop.wait(HEARTBEAT_S):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
