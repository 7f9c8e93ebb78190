"""`tuner run` against real vLLM-CPU on PostgreSQL: what a completed study stored.

Interrupting a real study and resuming it is tests/faults/test_run_faults.py's: SIGTERM (the same
path as Ctrl-C, tuner/cli.py) mid-trial on real vLLM-CPU, and SIGINT in-process on SQLite."""

from __future__ import annotations

import os
import sys

import pytest

from tests.e2e.conftest import SmallStudy, load_studies
from tuner.host.placement import Placement
from tuner.schema import StudyAttr

pytestmark = pytest.mark.e2e


def test_study_on_postgresql_completes_with_stored_decision(small_study: SmallStudy) -> None:
    """The fixture ran `tuner run` on a real PostgreSQL server; check what it stored."""
    out, name = small_study.output, small_study.name
    assert f"study {name}: " in out
    studies = load_studies(small_study.storage)
    stage = studies[f"{name}:batching"]
    search = [t for t in stage.trials if t.user_attrs.get("role") == "search"]
    assert len(search) == 2 and all(t.state.name == "COMPLETE" for t in search)
    incumbent = [t for t in stage.trials if t.user_attrs.get("role") == "incumbent"]
    assert len(incumbent) == 1 and incumbent[0].number == 0  # the control, not re-run
    decision = stage.user_attrs["decision"]
    assert decision["stage"] == "batching" and isinstance(decision["accepted"], bool)
    assert ("ACCEPTED" in out) == decision["accepted"]
    # one stage: a kept baseline is shown once, a new incumbent as a change from it
    assert ("baseline vs final incumbent" in out) == decision["accepted"]
    assert ("the baseline stays: no stage proved a gain" in out) != decision["accepted"]
    # tuner's placement on this host: where each side ran, and the CPUs the cost bills
    allowed = sorted(os.sched_getaffinity(0))
    place = Placement(None, None)
    if len(allowed) >= 2:
        place = Placement(tuple(allowed[:-1]), tuple(allowed[-1:]))
    assert f"CPUs: {place.describe()} (placement)" in out
    cpus, billed = place.as_text(), len(place.server or allowed)
    baseline = studies[stage.user_attrs[StudyAttr.BASELINE_STUDY]]  # the storage holds others too
    assert baseline.user_attrs["fingerprint"]["placement"] == cpus
    for t in search:  # what the dashboard shows without extra code
        assert t.user_attrs["vllm_command"].startswith(sys.executable)
        assert t.user_attrs["m_e2e_p99_s"] > 0 and "stage" in t.user_attrs
        assert "VLLM_API_KEY" not in str(t.user_attrs)
        assert t.user_attrs["cpus"] == cpus
        tok_s = t.user_attrs["m_output_throughput_tok_s"]  # conf/cost/cpu.yaml: $0.05 a CPU-hour
        assert t.values[2] == pytest.approx(0.05 * billed / (tok_s * 3600) * 1e6, rel=1e-9)
    assert stage.metric_names == ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
    assert small_study.storage in (small_study.folder / "config.yaml").read_text()
