"""A window of the shipped Azure trace replayed by `tuner trial` on vLLM-CPU: the server's own
token counts equal the trace's (capped) ones, and a shared system prompt shows in vLLM's
prefix-cache hit rate. One server launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ONE_ENGINE_PROCESS
from tuner.config.workload import PrefixConfig
from tuner.loadgen.request_plan import load_tokenizer, read_plan
from tuner.measurement.records import read_records
from tuner.traffic.prompts import shared_prefix_blocks

pytestmark = pytest.mark.e2e

PREFIX_TOKENS = 512
# vLLM caches whole blocks: count only the prefix's first full blocks of the smallest size
# a CPU build uses, so the expected hits are a floor.
BLOCK = 128


def test_a_trace_window_replays_with_the_servers_token_counts(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    from tuner.cli import main

    workload = ["workload=trace", "workload.trace.start_s=270", "workload.warmup_s=2"]
    workload += ["workload.window_s=20", "workload.prefix.share=0.8"]
    workload += [f"workload.prefix.tokens={PREFIX_TOKENS}"]
    server = ["server.from_command=null", ONE_ENGINE_PROCESS]
    rc = main(
        ["trial", f"studies_dir={tmp_path}", "name=e2e", *server, *workload, "--trial-id", "t1"]
    )
    assert rc == 0
    folder = tmp_path / "e2e" / "trials" / "t1"
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "ok"
    plan = read_plan(folder / "loadgen" / "plan.jsonl")
    records = sorted(read_records(folder / "requests.jsonl"), key=lambda r: r.scheduled_at)
    assert len(records) >= 50 and len(records) <= len(plan)
    # what the server adds to the prompt text alone: its BOS token
    tok = load_tokenizer(str(tiny_model))
    extra = len(tok.encode("a b", add_special_tokens=True)) - len(tok.encode("a b"))
    # the client sends a prefix of the trace's schedule, in its order
    pairs = list(zip(plan, records, strict=False))
    assert all(p.max_tokens == r.max_tokens for p, r in pairs)
    ok = [(p, r) for p, r in pairs if r.ok]
    assert len(ok) >= 0.99 * len(records)
    same_prompt = sum(r.prompt_tokens == p.prompt_tokens_target + extra for p, r in ok)
    same_output = sum(r.output_tokens == p.max_tokens for p, r in ok)
    assert same_prompt >= 0.99 * len(ok), (same_prompt, len(ok))
    assert same_output >= 0.99 * len(ok), (same_output, len(ok))
    assert max(p.prompt_tokens_target + p.max_tokens for p in plan) <= 2048
    m = result["measurements"]
    assert "late_sends" in m and m["late_sends"] >= 0

    # The shared system prompt: what vLLM could serve from its cache, at the least.
    blocks = shared_prefix_blocks(PrefixConfig(0.8, 1, PREFIX_TOKENS), len(plan), 0)
    shared = [
        bool(b) and p.prompt_tokens_target > PREFIX_TOKENS
        for p, b in zip(plan, blocks, strict=True)
    ]
    reusable = (sum(shared[: len(records)]) - 1) * (PREFIX_TOKENS // BLOCK - 1) * BLOCK
    prompt_tokens = sum(p.prompt_tokens_target + extra for p in plan[: len(records)])
    hit_rate = result["telemetry"]["metrics"]["prefix_cache_hit_rate"]
    assert hit_rate >= 0.5 * reusable / prompt_tokens > 0.05, (hit_rate, reusable, prompt_tokens)
