"""A trace as the request plan: send times, exact prompt lengths with the real tokenizer, forced
outputs, the cap; shared prefixes (system prompts, Mooncake hash ids) as identical text; each
request's class (the trace's column or a prompt-length rule) with its workload class's api and
priority."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.config.workload import (
    PrefixConfig,
    RequestClass,
    TraceClass,
    TraceConfig,
    WorkloadConfig,
)
from tuner.errors import ConfigError
from tuner.loadgen import request_plan as wl
from tuner.traffic.trace import SPECIAL_TOKENS_RESERVE

SAMPLE = str(
    Path(__file__).parents[2] / "conf" / "workload" / "traces" / "azure_code_2023_sample.csv"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return wl.load_tokenizer(str(tiny_model))


def _text(p: wl.PlannedRequest) -> str:
    text = p.prompt if p.messages is None else p.messages[0]["content"]
    assert text is not None
    return text


def _ids(tokenizer: Any, p: wl.PlannedRequest) -> list[int]:
    return list(tokenizer.encode(_text(p), add_special_tokens=False))


def _trace_workload(
    path: Path, mix: list[RequestClass] | None = None, **trace: Any
) -> WorkloadConfig:
    """A trace replay; ``mix``: the workload's classes."""
    workload = WorkloadConfig(
        mode="open", warmup_s=1, window_s=9, trace=TraceConfig(str(path), **trace)
    )
    if mix is not None:
        workload.classes = mix
    workload.validate()
    return workload


def _chat_and_documents() -> list[RequestClass]:
    return [
        RequestClass(name="chat", api="chat", priority=0),
        RequestClass(name="documents", api="completions", priority=10),
    ]


def test_a_trace_plan_has_its_send_times_and_exact_lengths(
    tmp_path: Path, tiny_model: Path, tokenizer: Any
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens\n0,9,9\n100,40,5\n100.5,3000,7\n103,12,9\n200,8,8\n"
    )
    workload = _trace_workload(path, start_s=100, rate_scale=2, max_model_len=1024)
    plan = wl.build_plan(workload, str(tiny_model))
    # the window is [100, 100 + 10 s x 2) of the trace's clock (0 at its first request)
    assert [p.arrival_s for p in plan] == [0.0, 0.25, 1.5]
    assert [p.max_tokens for p in plan] == [5, 7, 9]
    capped = 1024 - SPECIAL_TOKENS_RESERVE - 7
    assert [p.prompt_tokens_target for p in plan] == [40, capped, 12]
    assert [len(_ids(tokenizer, p)) for p in plan] == [40, capped, 12]
    assert json.loads(plan[0].to_json())["arrival_s"] == 0.0


def test_mooncake_hash_ids_replay_as_identical_prefix_blocks(
    tmp_path: Path, tiny_model: Path, tokenizer: Any
) -> None:
    path = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 70, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 100, "input_length": 50, "output_length": 4, "hash_ids": [1, 2, 9]},
        {"timestamp": 200, "input_length": 40, "output_length": 4, "hash_ids": [7, 8]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = wl.build_plan(_trace_workload(path, block_tokens=16), str(tiny_model))
    a, b, c = (_ids(tokenizer, p) for p in plan)
    assert (len(a), len(b), len(c)) == (70, 50, 40)
    assert a[:32] == b[:32]  # blocks 1 and 2 are the same tokens
    assert a[32:48] != b[32:48] and a[:16] != c[:16]
    assert _text(plan[1]).startswith(tokenizer.decode(a[:32]))


def test_a_share_of_requests_opens_with_one_of_k_system_prompts(
    tiny_model: Path, tokenizer: Any
) -> None:
    workload = WorkloadConfig(prefix=PrefixConfig(share=0.8, prompts=2, tokens=24))
    workload.classes[0].prompt_tokens.mean = 40
    workload.validate()
    plan = wl.synthesize_plan(workload, tokenizer, 200)
    heads = [tuple(_ids(tokenizer, p)[:24]) for p in plan]
    assert all(len(_ids(tokenizer, p)) == 40 for p in plan)
    counts = sorted((heads.count(h) for h in set(heads)), reverse=True)
    assert len(counts) > 3  # the others have heads of their own
    shared = counts[0] + counts[1]
    assert 0.7 * 200 <= shared <= 0.9 * 200
    assert counts[1] >= 0.3 * 200  # both prompts are used
    assert counts[2] == 1


def test_no_prefix_share_keeps_the_synthetic_plan_as_it_was(tokenizer: Any) -> None:
    workload = WorkloadConfig()
    a = wl.synthesize_plan(workload, tokenizer, 20)
    b = [
        wl.PromptSynthesizer(tokenizer, wl._rng(0, 3)).make(int(p.prompt_tokens_target))
        for p in a[:1]
    ]
    assert _text(a[0]) == b[0]


def test_each_replayed_request_carries_the_traces_class(
    tmp_path: Path, tiny_model: Path, tokenizer: Any
) -> None:
    path = tmp_path / "c.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,request_class\n"
        "0,20,4,chat\n1,300,8,documents\n2,30,4,chat\n3,250,6,documents\n"
    )
    plan = wl.build_plan(_trace_workload(path, _chat_and_documents()), str(tiny_model))
    assert [p.request_class for p in plan] == ["chat", "documents", "chat", "documents"]
    # each is sent as its workload class: its api, its priority
    assert [p.api for p in plan] == ["chat", "completions", "chat", "completions"]
    assert [p.priority for p in plan] == [0, 10, 0, 10]
    assert plan[0].messages is not None and plan[1].prompt is not None
    assert [len(_ids(tokenizer, p)) for p in plan] == [20, 300, 30, 250]
    # another workload, other priorities: not the cached plan of the first
    other = _chat_and_documents()
    other[1].priority = 3
    again = wl.build_plan(_trace_workload(path, other), str(tiny_model))
    assert [p.priority for p in again] == [0, 3, 0, 3]


def test_a_rule_on_prompt_length_classes_the_replay(tmp_path: Path, tiny_model: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,64,4\n1,65,4\n2,3000,4\n3,10,4\n")
    rule = [TraceClass("chat", 64), TraceClass("documents")]
    workload = _trace_workload(path, _chat_and_documents(), classes=rule, max_model_len=1024)
    plan = wl.build_plan(workload, str(tiny_model))
    # the recorded length classes a request: the 3000-token one is capped, but still documents
    assert [p.request_class for p in plan] == ["chat", "documents", "documents", "chat"]
    assert plan[2].prompt_tokens_target < 1024
    assert [p.priority for p in plan] == [0, 10, 10, 0]


def test_a_trace_without_classes_replays_as_one_class(tmp_path: Path, tiny_model: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,9,4\n1,12,4\n")
    plan = wl.build_plan(_trace_workload(path, api="chat"), str(tiny_model))
    assert {(p.request_class, p.api, p.priority) for p in plan} == {("trace", "chat", 0)}


def test_a_class_column_value_the_workload_lacks_is_refused(tmp_path: Path) -> None:
    from tuner.traffic.replay import check_replay

    path = tmp_path / "c.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,request_class\n0,20,4,chat\n1,300,8,summary\n"
    )
    workload = _trace_workload(path, _chat_and_documents())
    with pytest.raises(ConfigError, match=r"row 2: request_class='summary' is not a class of"):
        check_replay(workload, "/no/tokenizer")


def _rule(*items: tuple[str, int | None]) -> list[TraceClass]:
    return [TraceClass(name, bound) for name, bound in items]


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        (
            {"classes": _rule(("chat", 512), ("summaries", None))},
            r"classes\[1\].name='summaries' is not a class of the workload",
        ),
        (
            {"classes": _rule(("chat", 512), ("documents", 512))},
            r"classes\[1\].max_prompt_tokens=512 does not increase",
        ),
        (
            {"classes": _rule(("chat", None), ("documents", 4096))},
            r"classes\[0\] \('chat'\) has no max_prompt_tokens but is not the last",
        ),
        ({"classes": _rule(("chat", 0), ("documents", None))}, "max_prompt_tokens=0 must be"),
        ({"classes": _rule(("chat", 8), ("chat", None))}, r"'chat' is already"),
        ({"classes": _rule(("", None))}, r"classes\[0\].name is empty"),
        (
            {"class_column": "kind", "classes": _rule(("chat", None))},
            "class_column='kind' and workload.trace.classes both class",
        ),
        ({"class_column": ""}, "class_column is empty"),
    ],
)
def test_a_bad_class_rule_is_refused_naming_its_key(trace: dict[str, Any], message: str) -> None:
    workload = WorkloadConfig(
        mode="open", classes=_chat_and_documents(), trace=TraceConfig(SAMPLE, **trace)
    )
    with pytest.raises(ConfigError, match=message) as caught:
        workload.validate()
    assert "workload.trace." in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": "closed"}, "replayed open loop"),
        ({"trace": TraceConfig(SAMPLE, rate_scale=0)}, "rate_scale must be > 0"),
        ({"trace": TraceConfig("")}, "trace.path is empty"),
        ({"trace": TraceConfig("no.csv")}, "trace.path 'no.csv' is not a file"),
        ({"prefix": PrefixConfig(share=1.5)}, "workload.prefix"),
    ],
)
def test_a_bad_trace_or_prefix_config_is_refused(change: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"mode": "open", "trace": TraceConfig(SAMPLE)}
    with pytest.raises(ConfigError, match=message):
        WorkloadConfig(**{**base, **change}).validate()


def test_a_session_turn_opens_with_the_conversation_so_far(
    tmp_path: Path, tiny_model: Path, tokenizer: Any
) -> None:
    path = tmp_path / "s.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,session_id\n0,20,6,a\n1,15,4,b\n5,40,6,a\n9,70,3,a\n"
    )
    plan = wl.build_plan(_trace_workload(path), str(tiny_model))
    a1, b1, a2, a3 = (_ids(tokenizer, p) for p in plan)
    assert [len(x) for x in (a1, b1, a2, a3)] == [20, 15, 40, 70]
    assert a2[:20] == a1  # turn 2 carries turn 1's prompt, then a stand-in of its answer
    assert a3[:40] == a2  # and turn 3 all of turn 2's prompt
    assert a2[:5] != b1[:5]  # another session shares nothing


@pytest.mark.parametrize("command", ["trial", "run"])
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("workload.trace.start_s=100000", "holds no requests"),
        ("workload.trace.path={long} workload.trace.start_s=0", "exceeds max_model_len=4096"),
        (
            "workload.trace.path={classed} workload.trace.start_s=0",
            "row 2: request_class='documents' is not a class of the workload",
        ),
        (
            "workload.trace.classes=[{{name:chat,max_prompt_tokens:512}},{{name:documents}}]",
            "workload.trace.classes[0].name='chat' is not a class of the workload",
        ),
    ],
)
def test_a_trace_window_that_replays_nothing_stops_before_any_server_starts(
    command: str,
    override: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tuner.cli import main

    long = tmp_path / "long.csv"
    long.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,10\n1,6000,10\n")
    classed = tmp_path / "classed.csv"
    classed.write_text(
        "arrival_s,prompt_tokens,output_tokens,request_class\n0,50,10,trace\n1,60,10,documents\n"
    )
    cap = "workload.trace.max_model_len=4096"
    given = override.format(long=long, classed=classed).split()
    args = ["workload=trace", *given, cap, f"studies_dir={tmp_path}", "name=t"]
    rc = main([command, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("tuner: error:") and message in err[0], err
    assert not list(tmp_path.rglob("server.log"))  # nothing was launched


def test_a_trace_trial_says_what_the_trace_sends(tiny_model: Path) -> None:
    """The load line of a trace replay describes the trace (its requests, rate and gaps),
    never the open loop's unused ``rate`` (it said "open loop 1 req/s, burstiness 1")."""
    from tuner.composition import compose
    from tuner.trial.run import _shape

    config = compose(["workload=trace", "workload.warmup_s=1", "workload.window_s=29"])
    config.server.args["tokenizer"] = str(tiny_model)
    line = _shape(config)
    plan = wl.build_plan(config.workload, str(tiny_model))
    times = sorted(p.arrival_s for p in plan if p.arrival_s is not None)
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert config.workload.trace is not None
    start = config.workload.trace.start_s
    assert line.startswith(f"trace azure_code_2023_sample.csv from {start:g} s, x1: ")
    assert f"{len(times)} requests" in line and f"{rate:.2f} req/s" in line
    assert "gap CV" in line and "open loop" not in line
    # an untimed plan has no arrival shape
    assert wl.arrival_shape([p for p in plan][:1]) is None
