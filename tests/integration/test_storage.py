"""Study storage against real databases: SQLite files and the PostgreSQL server of this machine."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import optuna
import pytest

from tuner import storage as st
from tuner.errors import ConfigError, StorageError

pytestmark = pytest.mark.integration
PG = "postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:5432/test"


def test_bad_urls_are_config_or_storage_errors_without_the_password() -> None:
    with pytest.raises(ConfigError):
        st.open_storage("not a url")
    with pytest.raises(StorageError) as info:
        st.open_storage("postgresql+psycopg://u:s3cret-pw@127.0.0.1:1/nope")
    assert "s3cret-pw" not in info.value.one_line() and "***" in info.value.one_line()
    assert st.redact_url(PG) == "postgresql+psycopg://postgres:***@127.0.0.1:5432/test"


def _running_trial(url: str) -> tuple[optuna.Study, optuna.Trial]:
    study = optuna.create_study(storage=st.open_storage(url), study_name=uuid.uuid4().hex)
    return study, study.ask()


def test_exclusive_local_run_fails_every_left_over_running_trial(tmp_path: Path) -> None:
    study, _trial = _running_trial(f"sqlite:///{tmp_path / 'o.db'}")
    assert st.fail_unfinished_trials(study, exclusive=True) == 1
    frozen = study.trials[0]
    assert frozen.state == optuna.trial.TrialState.FAIL
    assert frozen.user_attrs[st.ATTR_INTERRUPTED] is True


def test_shared_storage_fails_only_trials_whose_heartbeat_went_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    monkeypatch.setattr(st, "GRACE_S", 1)
    study, alive = _running_trial(url)
    dead = study.ask()
    with st.Heartbeat(study, alive._trial_id):
        study._storage.record_heartbeat(dead._trial_id)  # type: ignore[attr-defined]
        time.sleep(1.5)  # `dead` stays silent past the grace period; `alive` beats again
        study._storage.record_heartbeat(alive._trial_id)  # type: ignore[attr-defined]
        failed = st.fail_unfinished_trials(study, exclusive=False)
    states = {t.number: t.state for t in study.trials}
    assert failed == 1
    assert states[dead.number] == optuna.trial.TrialState.FAIL
    assert states[alive.number] == optuna.trial.TrialState.RUNNING
