"""run_quality_set against a real local OpenAI-compatible HTTP server (tests/fakes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.loadgen.generator import Target
from tuner.quality import QualityConfig, QualityOutputs, load_items, run_quality_set, score
from tuner.testing.sse_server import FakeConfig, FakeServer

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]


def test_quality_set_against_local_server(tmp_path: Path) -> None:
    items = load_items()
    config = FakeConfig(ttft_s=0.0, itl_s=0.0, api_key="k", model="m")
    with FakeServer(config) as fake:
        target = Target(fake.url, "k", "m", "m")
        q = QualityConfig(max_tokens=4)
        first = run_quality_set(target, q, tmp_path / "a.jsonl", items)
        fake.reset(FakeConfig(ttft_s=0.0, itl_s=0.0, api_key="k", model="m", fail_every=5))
        second = run_quality_set(target, q, tmp_path / "b.jsonl", items)
        wrong_key = run_quality_set(Target(fake.url, "x", "m", "m"), q, tmp_path / "c.jsonl", items)
    assert first.errors == 0 and len(first.rows) == len(items)
    assert {r.settings for r in first.rows} == {"max_tokens=4 ignore_eos=True"}
    assert all(r.text == "alpha beta gamma delta" for r in first.rows)  # max_tokens was sent
    assert all(r.prompt_tokens and r.prompt_tokens > 0 for r in first.rows)
    assert second.errors == len(items) // 5
    assert all(r.error == "HTTP 503: injected failure" for r in second.rows if r.error)
    assert wrong_key.errors == len(items) and wrong_key.rows[0].error == "HTTP 401: Unauthorized"
    s = score(QualityOutputs.read(tmp_path / "b.jsonl"), first, items)
    assert s.token_agreement == pytest.approx(1 - second.errors / len(items))
    assert s.compared == len(items)
