"""Trace readers: each public layout by its columns or by name, windows, rate scale, the cap."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.traffic.trace import (
    SPECIAL_TOKENS_RESERVE,
    TraceOptions,
    load,
    read_trace,
    select,
)

SAMPLE = Path(__file__).parents[2] / "conf" / "workload" / "traces" / "azure_code_2023_sample.csv"


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
