"""Trace readers: each public layout by its columns or by name, windows, rate scale, the cap;
each request's class from a class column or from a rule on its prompt length."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.config.workload import TraceClass
from tuner.errors import ConfigError
from tuner.traffic.trace import (
    LAYOUTS,
    SPECIAL_TOKENS_RESERVE,
    ClassBy,
    TraceOptions,
    load,
    read_trace,
    select,
    write_plain,
)

SAMPLE = Path(__file__).parents[2] / "conf" / "workload" / "traces" / "azure_code_2023_sample.csv"
CHAT_DOCS = (TraceClass("chat", 512), TraceClass("documents"))


def test_the_shipped_azure_sample_reads_by_its_columns() -> None:
    trace = read_trace(SAMPLE)
    assert trace.layout == "azure"
    assert len(trace) == 1482
    assert trace.arrivals[0] == 0.0 and np.all(np.diff(trace.arrivals) >= 0)
    assert trace.span_s < 600
    # the first row of the file: 2023-11-16 18:17:03.98, 4808 context tokens, 10 generated
    assert trace.prompt_tokens[0] == 4808 and trace.output_tokens[0] == 10
    assert trace.arrivals[1] == pytest.approx(0.052)


def test_burstgpt_seconds_and_failed_requests_dropped(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "10.5,ChatGPT,100,20,120,Conversation log\n"
        "5.0,ChatGPT,50,0,50,Conversation log\n"
        "12.0,GPT-4,30,7,37,API log\n"
    )
    trace = read_trace(path)
    assert trace.layout == "burstgpt"
    assert trace.prompt_tokens.tolist() == [100, 30]
    assert trace.arrivals.tolist() == [0.0, 1.5]
    assert trace.notes == ["dropped 1 requests with 0 prompt or output tokens"]


def test_mooncake_jsonl_milliseconds_and_prefix_blocks(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 250, "input_length": 700, "output_length": 5, "hash_ids": [1, 3]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = read_trace(path)
    assert trace.layout == "mooncake"
    assert trace.arrivals.tolist() == [0.0, 0.25]
    assert trace.frame["hash_ids"].tolist() == [[1, 2], [1, 3]]


def test_a_plain_trace_with_prefix_and_session_ids(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_id,session_id\n0,10,5,a,s1\n2,20,6,a,s1\n"
    )
    trace = read_trace(path)
    assert trace.layout == "plain"
    assert trace.frame["prefix_id"].tolist() == ["a", "a"]
    assert trace.frame["session_id"].tolist() == ["s1", "s1"]


def test_a_named_layout_is_checked_against_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    assert read_trace(path, "plain").layout == "plain"
    with pytest.raises(ConfigError, match="lacks the azure columns TIMESTAMP"):
        read_trace(path, "azure")
    with pytest.raises(ConfigError, match="layout 'nope' is unknown"):
        read_trace(path, "nope")


def test_an_unknown_layout_names_the_columns_found(tmp_path: Path) -> None:
    path = tmp_path / "odd.csv"
    path.write_text("when,in,out\n0,1,2\n")
    with pytest.raises(ConfigError, match="unknown layout: columns when, in, out"):
        read_trace(path)


def test_a_window_is_replayed_from_zero_and_a_rate_scale_compresses_it() -> None:
    trace = load(SAMPLE, TraceOptions(start_s=180, duration_s=120, rate_scale=2))
    whole = read_trace(SAMPLE)
    inside = (whole.arrivals >= 180) & (whole.arrivals < 300)
    assert len(trace) == int(inside.sum())
    assert trace.arrivals.max() < 60 and trace.arrivals.min() >= 0
    assert trace.arrivals[0] == pytest.approx((whole.arrivals[inside][0] - 180) / 2)


def test_an_empty_window_and_a_bad_rate_scale_are_refused() -> None:
    whole = read_trace(SAMPLE)
    with pytest.raises(ConfigError, match="holds no requests"):
        select(whole, TraceOptions(start_s=5000))
    with pytest.raises(ConfigError, match="rate_scale must be > 0"):
        select(whole, TraceOptions(rate_scale=0))


def test_the_cap_clips_long_prompts_and_says_how_many() -> None:
    whole = read_trace(SAMPLE)
    trace = select(whole, TraceOptions(max_model_len=2048))
    total = trace.prompt_tokens + trace.output_tokens
    assert total.max() <= 2048 - SPECIAL_TOKENS_RESERVE
    over = int((whole.prompt_tokens + whole.output_tokens > 2048 - SPECIAL_TOKENS_RESERVE).sum())
    assert over > 0
    assert trace.notes[-1].startswith(f"clipped {over} of 1482 prompts")
    # requests that fit are untouched
    fits = whole.prompt_tokens + whole.output_tokens <= 2048 - SPECIAL_TOKENS_RESERVE
    assert (trace.prompt_tokens[fits] == whole.prompt_tokens[fits]).all()


def test_a_trace_none_of_whose_requests_fits_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,10\n1,6000,10\n")
    with pytest.raises(ConfigError, match=r"every request .* exceeds max_model_len=4096"):
        load(path, TraceOptions(max_model_len=4096))


def _mixed(path: Path, n: int = 400, seed: int = 3) -> pd.DataFrame:
    """A made-up plain trace of two classes of clearly different lengths, rows out of order:
    chat (prompts 20-400, outputs 5-50) and documents (prompts 1000-4000, outputs 100-300)."""
    rng = np.random.default_rng(seed)
    chat = rng.random(n) < 0.7
    frame = pd.DataFrame(
        {
            "arrival_s": rng.permutation(np.cumsum(rng.exponential(0.5, n))),
            "prompt_tokens": np.where(chat, rng.integers(20, 400, n), rng.integers(1000, 4000, n)),
            "output_tokens": np.where(chat, rng.integers(5, 50, n), rng.integers(100, 300, n)),
            "request_class": np.where(chat, "chat", "documents"),
        }
    )
    frame.to_csv(path, index=False)
    return frame


def test_a_plain_trace_names_each_requests_class_in_its_column(tmp_path: Path) -> None:
    assert LAYOUTS["plain"].request_class == "request_class"
    assert LAYOUTS["azure"].request_class is None
    source = _mixed(tmp_path / "mixed.csv")
    trace = read_trace(tmp_path / "mixed.csv")
    assert trace.layout == "plain"
    by_time = source.sort_values("arrival_s", kind="stable")
    # each class travels with its request through the sort by arrival
    assert trace.request_classes == by_time["request_class"].tolist()
    assert trace.prompt_tokens.tolist() == by_time["prompt_tokens"].tolist()
    assert trace.class_names == ["chat", "documents"]  # a column's, by name
    # and through a window and a plain re-write
    window = select(trace, TraceOptions(start_s=20, duration_s=50))
    inside = (trace.arrivals >= 20) & (trace.arrivals < 70)
    assert window.request_classes == [
        c for c, i in zip(trace.request_classes, inside, strict=True) if i
    ]
    write_plain(window, tmp_path / "again.jsonl")
    assert read_trace(tmp_path / "again.jsonl").request_classes == window.request_classes


def test_a_trace_without_classes_has_none(tmp_path: Path) -> None:
    trace = read_trace(SAMPLE)
    assert trace.request_classes is None and trace.class_names == []


def test_another_column_can_name_the_class(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "10.5,ChatGPT,100,20,120,Conversation log\n"
        "12.0,GPT-4,30,7,37,API log\n"
    )
    trace = read_trace(path, classes=ClassBy(column="Model"))
    assert trace.request_classes == ["ChatGPT", "GPT-4"]
    assert read_trace(path).request_classes is None  # BurstGPT's layout names no class column


def test_a_rule_on_prompt_length_classes_requests_first_match_wins(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens\n0,512,5\n1,513,5\n2,1,5\n3,3000,5\n4,2048,5\n"
    )
    rule = (TraceClass("chat", 512), TraceClass("code", 2048), TraceClass("documents"))
    trace = read_trace(path, classes=ClassBy(rule=rule))
    # a prompt at a bound is in that class; the recorded length decides, before any cap
    assert trace.request_classes == ["chat", "code", "chat", "documents", "code"]
    capped = load(path, TraceOptions(max_model_len=1024), classes=ClassBy(rule=rule))
    assert capped.request_classes == trace.request_classes
    assert capped.prompt_tokens.max() < 1024
    assert trace.class_names == ["chat", "code", "documents"]  # the rule's order


def test_the_rule_and_the_column_agree_on_a_made_up_trace(tmp_path: Path) -> None:
    source = _mixed(tmp_path / "mixed.csv")
    source.drop(columns="request_class").to_csv(tmp_path / "bare.csv", index=False)
    by_rule = read_trace(tmp_path / "bare.csv", classes=ClassBy(rule=CHAT_DOCS))
    by_column = read_trace(tmp_path / "mixed.csv")
    assert by_rule.request_classes == by_column.request_classes


@pytest.mark.parametrize("bound", [512, 2048])
def test_a_rule_on_the_azure_sample_splits_it_as_pandas_does(bound: int) -> None:
    rule = (TraceClass("short", bound), TraceClass("long"))
    trace = read_trace(SAMPLE, classes=ClassBy(rule=rule))
    raw = pd.read_csv(SAMPLE)
    kept = raw[(raw["ContextTokens"] >= 1) & (raw["GeneratedTokens"] >= 1)]
    assert len(trace) == len(kept) > 1000
    short = float((kept["ContextTokens"] <= bound).mean())
    classes = np.asarray(trace.request_classes)
    assert float((classes == "short").mean()) == pytest.approx(short, abs=1e-12)
    assert float((classes == "long").mean()) == pytest.approx(1 - short, abs=1e-12)
    assert 0.05 < short < 0.95


def test_a_class_the_workload_lacks_names_its_value_and_row(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,request_class\n"
        "0,10,5,chat\n1,10,5,chat\n2,900,5,summaries\n"
    )
    known = ClassBy(known=("chat", "documents"))
    with pytest.raises(ConfigError, match=r"row 3: request_class='summaries' is not a class of"):
        read_trace(path, classes=known)
    assert read_trace(path).request_classes == ["chat", "chat", "summaries"]  # any, unchecked
    path.write_text("arrival_s,prompt_tokens,output_tokens,request_class\n0,10,5,chat\n1,9,5,\n")
    with pytest.raises(ConfigError, match=r"row 2: no request_class"):
        read_trace(path)


def test_bad_class_sources_are_refused(tmp_path: Path) -> None:
    classed = tmp_path / "classed.csv"
    classed.write_text("arrival_s,prompt_tokens,output_tokens,request_class\n0,10,5,chat\n")
    with pytest.raises(ConfigError, match=r"workload.trace.classes and the class column"):
        read_trace(classed, classes=ClassBy(rule=CHAT_DOCS))
    with pytest.raises(ConfigError, match=r"class_column='model' is not a column of trace"):
        read_trace(classed, classes=ClassBy(column="model"))
    bounded = (TraceClass("chat", 512), TraceClass("documents", 4096))
    with pytest.raises(ConfigError, match=r"row 1: a prompt of 4808 tokens is over every class"):
        read_trace(SAMPLE, classes=ClassBy(rule=bounded))
