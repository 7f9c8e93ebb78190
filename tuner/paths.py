"""The only owner of the on-disk layout of a study.

::

    studies/<name>/
      optuna.db               default storage
      config.yaml             the composed config of the run
      trials/<trial_id>/      server.log, requests.jsonl, loadgen/ (Locust's CSV, HTML, log),
                              telemetry.csv, quality.jsonl, result.json
      artifacts/              optuna-dashboard's copies of trial files
      report/                 report.html, *.png, trials.csv, trials.parquet
      export/                 vllm-serve.sh, vllm-config.yaml, docker-run.sh, k8s.yaml,
                              evidence.json
      dashboard.log           optuna-dashboard's output
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ArtifactError

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def user_cache_dir() -> Path:
    """$TUNER_CACHE_DIR, else $XDG_CACHE_HOME/tuner, else ~/.cache/tuner: what tuner keeps per
    host and user, across studies."""
    if os.environ.get("TUNER_CACHE_DIR"):
        return Path(os.environ["TUNER_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tuner"


def client_capacity_file() -> Path:
    """The load generator's measured SSE-event capacity per host (tuner.loadgen.client_capacity)."""
    return user_cache_dir() / "client-capacity.json"


def safe_name(text: str) -> str:
    """A file-system-safe version of a study or trial name."""
    cleaned = _SAFE.sub("-", text).strip("-.")
    return cleaned or "unnamed"


@dataclass(frozen=True)
class StudyPaths:
    """Paths of one study folder. Creating folders is explicit (:meth:`ensure`)."""

    root: Path

    @classmethod
    def for_study(cls, studies_dir: str | Path, name: str) -> StudyPaths:
        return cls(Path(studies_dir).resolve() / safe_name(name))

    @property
    def storage_db(self) -> Path:
        return self.root / "optuna.db"

    @property
    def default_storage_url(self) -> str:
        return f"sqlite:///{self.storage_db}"

    @property
    def config_yaml(self) -> Path:
        return self.root / "config.yaml"

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def export_dir(self) -> Path:
        return self.root / "export"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def dashboard_log(self) -> Path:
        return self.root / "dashboard.log"

    def trial(self, trial_id: str) -> TrialPaths:
        return TrialPaths(self.trials_dir / safe_name(trial_id))

    def ensure(self) -> StudyPaths:
        _mkdir(self.root)
        _mkdir(self.trials_dir)
        return self


@dataclass(frozen=True)
class TrialPaths:
    """Files of one trial."""

    root: Path

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def requests(self) -> Path:
        return self.root / "requests.jsonl"

    @property
    def telemetry_csv(self) -> Path:
        return self.root / "telemetry.csv"

    @property
    def quality(self) -> Path:
        return self.root / "quality.jsonl"

    @property
    def result_json(self) -> Path:
        return self.root / "result.json"

    @property
    def loadgen_dir(self) -> Path:
        return self.root / "loadgen"

    def ensure(self) -> TrialPaths:
        _mkdir(self.root)
        return self


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(
            f"cannot create folder {path}: {exc.strerror}",
            hint="check the studies_dir setting and the disk's permissions and free space",
        ) from exc
