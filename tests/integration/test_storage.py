"""Study storage against real databases: SQLite files and the PostgreSQL server of this machine."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import optuna
import pytest

from tuner.errors import ConfigError, StorageError
from tuner.schema import TrialAttr
from tuner.study.state import storage as st

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
PG = "postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:5432/test"


def test_bad_urls_are_config_or_storage_errors_without_the_password() -> None:
    with pytest.raises(ConfigError):
        st.open_storage("not a url")
    with pytest.raises(StorageError) as info:
        st.open_storage("postgresql+psycopg://u:s3cret-pw@127.0.0.1:1/nope")
    assert "s3cret-pw" not in info.value.one_line() and "***" in info.value.one_line()
    assert st.redact_url(PG) == "postgresql+psycopg://postgres:***@127.0.0.1:5432/test"


def _running_trial(url: str) -> tuple[optuna.storages.RDBStorage, optuna.Study, optuna.Trial]:
    storage = st.open_storage(url)
    study = optuna.create_study(storage=storage, study_name=uuid.uuid4().hex)
    return storage, study, study.ask()


def test_exclusive_local_run_fails_every_left_over_running_trial(tmp_path: Path) -> None:
    storage, study, _trial = _running_trial(f"sqlite:///{tmp_path / 'o.db'}")
    assert st.fail_unfinished_trials(storage, study, exclusive=True) == 1
    frozen = study.trials[0]
    assert frozen.state == optuna.trial.TrialState.FAIL
    assert frozen.user_attrs[TrialAttr.INTERRUPTED] is True


def test_shared_storage_fails_only_trials_whose_heartbeat_went_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    monkeypatch.setattr(st, "GRACE_S", 1)
    storage, study, alive = _running_trial(url)
    dead = study.ask()
    with st.Heartbeat(storage, st.trial_id(storage, study, alive.number)):
        storage.record_heartbeat(st.trial_id(storage, study, dead.number))
        time.sleep(1.5)  # `dead` stays silent past the grace period; `alive` beats again
        storage.record_heartbeat(st.trial_id(storage, study, alive.number))
        failed = st.fail_unfinished_trials(storage, study, exclusive=False)
    states = {t.number: t.state for t in study.trials}
    assert failed == 1
    assert states[dead.number] == optuna.trial.TrialState.FAIL
    assert states[alive.number] == optuna.trial.TrialState.RUNNING


def test_sqlite_storage_writes_ahead_so_a_reader_reads_while_a_trial_is_written(
    tmp_path: Path,
) -> None:
    """The embedded default in WAL mode: optuna-dashboard (another connection) reads the study
    while a commit holds the database (in a rollback journal's mode that read is refused:
    "database is locked")."""
    import sqlite3

    path = tmp_path / "optuna.db"
    storage = st.open_storage(f"sqlite:///{path}")
    study = optuna.create_study(storage=storage, study_name="wal")
    trial = study.ask()
    trial.set_user_attr("kept", 1)
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # a commit in progress, as each of a trial's attrs is
    writer.execute("UPDATE trials SET number = number")
    reader = sqlite3.connect(path, timeout=0.1)  # a rollback journal would refuse this read
    assert reader.execute("SELECT value_json FROM trial_user_attributes").fetchall() == [("1",)]
    writer.execute("ROLLBACK")
