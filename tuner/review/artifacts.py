"""Trial artifacts and study notes in optuna-dashboard, through Optuna's and its public APIs.

- :func:`upload_trial_artifacts`: a trial folder's files (server log, raw requests, Locust's
  HTML/CSV, telemetry, result.json) into the study's artifact store
  (``studies/<name>/artifacts``), attached to the trial, so they download from the dashboard.
  Text is redacted first. `tuner dashboard` attaches what a study's trials left in their
  folders. A live ``optuna.Trial`` takes them through :func:`optuna.artifacts.upload_artifact`;
  a finished trial no longer accepts trial attrs, so for it the metadata goes where
  optuna-dashboard also looks for a trial's artifacts: the study's
  ``dashboard:artifacts:<trial_id>:<artifact_id>`` attrs.
- :func:`write_study_note`: the study's markdown note (optuna-dashboard's ``save_note``).
"""

from __future__ import annotations

import json
import mimetypes
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from tuner.errors import ArtifactError
from tuner.paths import StudyPaths
from tuner.redact import Redactor
from tuner.study.state.storage import study_id, trial_id

# What a reviewer downloads, relative to the trial folder (missing files are skipped).
ARTIFACT_FILES = (
    "server.log",
    "requests.jsonl",
    "telemetry.csv",
    "result.json",
    "loadgen/locust.html",
    "loadgen/locust_stats.csv",
    "loadgen/locust_stats_history.csv",
    "loadgen/locust_failures.csv",
    "loadgen/locust_exceptions.csv",
    "loadgen/locust.log",
)
ARTIFACT_ATTR = "artifacts:"  # Optuna's prefix (trial system attrs)
DASHBOARD_ATTR = "dashboard:artifacts:"  # optuna-dashboard's prefix (study system attrs)
TrialRef = optuna.Trial | FrozenTrial | int
# Shown in the browser rather than downloaded as application/octet-stream.
MIMETYPES = {".log": "text/plain", ".jsonl": "text/plain", ".csv": "text/csv"}


def artifact_store(paths: StudyPaths) -> FileSystemArtifactStore:
    """The study's file-system artifact store (created on first use)."""
    try:
        paths.artifacts_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"cannot create {paths.artifacts_dir}: {exc.strerror}") from exc
    return FileSystemArtifactStore(str(paths.artifacts_dir))


def _frozen(study: optuna.Study, trial: TrialRef) -> FrozenTrial | optuna.Trial:
    if not isinstance(trial, int):
        return trial
    for t in study.get_trials(deepcopy=False):
        if t.number == trial:
            return t
    raise ArtifactError(f"study {study.study_name} has no trial number {trial}")


def _redacted_copy(src: Path, tmp: Path, redactor: Redactor) -> Path:
    dst = tmp / src.name
    try:
        text = src.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        dst.write_bytes(src.read_bytes())  # not text: nothing to redact
        return dst
    dst.write_text(redactor.text(text), encoding="utf-8")
    return dst


def _attach_finished(
    storage: BaseStorage,
    study: optuna.Study,
    trial: FrozenTrial,
    path: Path,
    store: FileSystemArtifactStore,
) -> str:
    artifact_id = str(uuid.uuid4())
    mimetype, encoding = _types(path)
    meta = {
        "artifact_id": artifact_id,
        "filename": path.name,
        "mimetype": mimetype or "application/octet-stream",
        "encoding": encoding,
    }
    with path.open("rb") as fh:
        store.write(artifact_id, fh)
    key = f"{DASHBOARD_ATTR}{trial_id(storage, study, trial.number)}:{artifact_id}"
    storage.set_study_system_attr(study_id(storage, study), key, json.dumps(meta))
    return artifact_id


def _upload_one(
    storage: BaseStorage,
    study: optuna.Study,
    trial: FrozenTrial | optuna.Trial,
    path: Path,
    store: FileSystemArtifactStore,
) -> str:
    if isinstance(trial, FrozenTrial) and trial.state.is_finished():
        return _attach_finished(storage, study, trial, path, store)
    mimetype, encoding = _types(path)
    return upload_artifact(
        artifact_store=store,
        file_path=str(path),
        study_or_trial=trial,
        storage=storage,
        mimetype=mimetype,
        encoding=encoding,
    )


def _types(path: Path) -> tuple[str | None, str | None]:
    mimetype, encoding = mimetypes.guess_type(path.name)
    return MIMETYPES.get(path.suffix, mimetype), encoding


def upload_trial_artifacts(
    storage: BaseStorage,
    study: optuna.Study,
    trial: TrialRef,
    folder: str | Path,
    store: FileSystemArtifactStore,
    redactor: Redactor | None = None,
    files: Iterable[str] = ARTIFACT_FILES,
) -> list[str]:
    """Attach ``folder``'s artifact files to ``trial`` of ``study`` in ``storage``; returns the
    artifact ids.

    ``trial``: the live ``optuna.Trial`` (call before ``study.tell``), a ``FrozenTrial``, or a
    trial number of ``study``. Text files are redacted (``redactor``, default: the secrets of
    this environment) before they are stored. Missing files are skipped.
    """
    target = _frozen(study, trial)
    redactor = redactor or Redactor.for_environment()
    root = Path(folder)
    ids = []
    with tempfile.TemporaryDirectory(prefix="tuner-artifacts-") as tmp:
        for rel in files:
            src = root / rel
            if src.is_file():
                copy = _redacted_copy(src, Path(tmp), redactor)
                ids.append(_upload_one(storage, study, target, copy, store))
    return ids


def has_artifacts(storage: BaseStorage, study: optuna.Study, trial: FrozenTrial) -> bool:
    """True if ``trial`` already has artifacts (either way of attaching them)."""
    if any(k.startswith(ARTIFACT_ATTR) for k in trial.system_attrs):
        return True
    prefix = f"{DASHBOARD_ATTR}{trial_id(storage, study, trial.number)}:"
    attrs = storage.get_study_system_attrs(study_id(storage, study))
    return any(k.startswith(prefix) for k in attrs)


def write_study_note(study: optuna.Study, markdown: str, redactor: Redactor | None = None) -> None:
    """Replace the study's note in optuna-dashboard with ``markdown`` (redacted)."""
    from optuna_dashboard import save_note

    save_note(study, (redactor or Redactor.for_environment()).text(markdown))
