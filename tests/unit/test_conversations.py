"""Multi-turn conversations (``workload.sessions``) as the request plan: each turn carries the
conversation so far, token for token, then its own new part; think times; whole conversations
per client process."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.config.workload import PrefixConfig, SessionConfig, TraceConfig, WorkloadConfig
from tuner.errors import ConfigError
from tuner.loadgen import request_plan as wl
from tuner.loadgen.process_share import plan_start

NEW, OUT = 20, 6  # each turn's new part and answer, in tokens


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return wl.load_tokenizer(str(tiny_model))


def _ids(tokenizer: Any, p: wl.PlannedRequest) -> list[int]:
    text = p.prompt if p.messages is None else p.messages[0]["content"]
    assert text is not None
    return list(tokenizer.encode(text, add_special_tokens=False))


def _workload(**sessions: Any) -> WorkloadConfig:
    workload = WorkloadConfig(sessions=SessionConfig(**sessions))
    workload.classes[0].prompt_tokens.mean = NEW
    workload.classes[0].output_tokens.mean = OUT
    workload.validate()
    return workload


def test_each_turn_opens_with_the_conversation_so_far(tokenizer: Any) -> None:
    plan = wl.synthesize_plan(_workload(turns=3, think_s=2.0), tokenizer, 10)
    assert len(plan) == 12  # rounded up to whole conversations
    assert [(p.session, p.turn) for p in plan[:4]] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    for first, second in itertools.pairwise(plan):
        if second.turn == 0:
            continue
        before, now = _ids(tokenizer, first), _ids(tokenizer, second)
        # the earlier prompt, a stand-in answer of its length, then this turn's new part
        assert now[: len(before)] == before
        assert len(now) == len(before) + OUT + NEW == second.prompt_tokens_target
    # two conversations share nothing
    assert _ids(tokenizer, plan[3])[:NEW] != _ids(tokenizer, plan[0])[:NEW]
    assert [p.prompt_tokens_target for p in plan[:3]] == [NEW, 2 * NEW + OUT, 3 * NEW + 2 * OUT]


def test_think_times_are_drawn_for_follow_up_turns_only(tokenizer: Any) -> None:
    plan = wl.synthesize_plan(_workload(turns=2, think_s=2.0), tokenizer, 800)
    firsts = [p.think_s for p in plan if p.turn == 0]
    follow = np.array([p.think_s for p in plan if p.turn == 1])
    assert set(firsts) == {0.0}
    assert np.mean(follow) == pytest.approx(2.0, rel=0.15)
    assert np.std(follow) == pytest.approx(2.0, rel=0.2)  # exponential: the std is the mean
    fixed = wl.synthesize_plan(_workload(turns=2, think_s=1.5, think="fixed"), tokenizer, 8)
    assert {p.think_s for p in fixed if p.turn == 1} == {1.5}


def test_a_conversation_opens_with_its_system_prompt_and_keeps_one_class(
    tokenizer: Any,
) -> None:
    workload = _workload(turns=2)
    workload.prefix = PrefixConfig(share=1.0, prompts=1, tokens=12)
    long = wl.RequestClass(name="long", api="chat", prompt_tokens=wl.LengthDist(mean=40))
    workload.classes.append(long)
    plan = wl.synthesize_plan(workload, tokenizer, 60)
    heads = {tuple(_ids(tokenizer, p)[:12]) for p in plan}
    assert len(heads) == 1  # every conversation, every turn
    for i in range(0, len(plan), 2):
        assert plan[i].request_class == plan[i + 1].request_class
        assert plan[i].api == plan[i + 1].api
    assert {p.request_class for p in plan} == {"default", "long"}


def test_without_sessions_the_plan_is_as_it_was(tokenizer: Any) -> None:
    one = wl.synthesize_plan(_workload(), tokenizer, 20)
    assert {(p.session, p.turn, p.think_s) for p in one} == {(None, 0, 0.0)}
    assert {p.prompt_tokens_target for p in one} == {NEW}


def test_client_processes_start_at_a_first_turn() -> None:
    assert [plan_start(i, 100, 2, 1) for i in range(2)] == [0, 50]
    assert [plan_start(i, 99, 2, 3) for i in range(2)] == [0, 48]  # 16 conversations each
    assert all(plan_start(i, 600, 4, 3) % 3 == 0 for i in range(4))


@pytest.mark.parametrize(
    ("sessions", "message"),
    [
        ({"turns": 0}, "turns >= 1"),
        ({"turns": 2, "think_s": -1.0}, "think_s >= 0"),
        ({"turns": 2, "think": "poisson"}, "think one of exponential, fixed"),
    ],
)
def test_a_bad_sessions_config_is_refused(sessions: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkloadConfig(sessions=SessionConfig(**sessions)).validate()


def test_sessions_with_a_trace_are_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    workload = WorkloadConfig(
        mode="open", trace=TraceConfig(str(trace)), sessions=SessionConfig(turns=2)
    )
    with pytest.raises(ConfigError, match="a trace or a dataset brings its own requests"):
        workload.validate()
