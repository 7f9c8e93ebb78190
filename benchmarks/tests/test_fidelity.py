"""benchmarks/fidelity.py: the prompts both clients send and the server-side comparison."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from benchmarks import fidelity
from tuner.loadgen import Target
from tuner.telemetry.metrics import HISTOGRAMS


def test_shared_prompts_are_distinct_fresh_per_run_and_read_by_vllm_bench_as_written(
    tiny_model: Path, tmp_path: Path
) -> None:
    """What the two clients of `compare` send: both read this file; vLLM's client reads it with
    its own CustomDataset and the arguments `dataset_argv` gives it."""
    from vllm.benchmarks.datasets.datasets import CustomDataset
    from vllm.tokenizers import get_tokenizer

    args = fidelity.parse_args(
        ["compare", "--num-prompts", "40", "--input-len", "64", "--output-len", "8"]
    )
    target = Target("http://unused", None, str(tiny_model), str(tiny_model))
    first = fidelity.prompts_file(args, target, tmp_path, seed=1)
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(rows) == 40 and len({r["prompt"] for r in rows}) == 40  # no prefix-cache repeats
    assert {r["max_tokens"] for r in rows} == {8}
    again = [
        json.loads(line)
        for line in fidelity.prompts_file(args, target, tmp_path, 2).read_text().splitlines()
    ]
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in again}  # fresh per run

    argv = fidelity.dataset_argv(args, first)
    assert argv[argv.index("--dataset-path") + 1] == str(first)
    tokenizer = get_tokenizer(str(tiny_model))
    sampled = CustomDataset(dataset_path=str(first), disable_shuffle=True).sample(
        tokenizer=tokenizer, num_requests=40, output_len=8, skip_chat_template=True
    )
    assert [s.prompt for s in sampled] == [r["prompt"] for r in rows]  # as written, in order
    assert {s.expected_output_len for s in sampled} == {8}
    # 64 tokens of text; vLLM's count includes the BOS token the server adds too.
    assert {s.prompt_len for s in sampled} <= {64, 65}


def test_the_server_view_divides_each_client_mean_by_the_servers_own() -> None:
    tpot, e2e = HISTOGRAMS["server_tpot_mean_s"], HISTOGRAMS["server_e2e_mean_s"]
    before = {f"{tpot}_sum": 1.0, f"{tpot}_count": 10.0, f"{e2e}_sum": 5.0, f"{e2e}_count": 10.0}
    # 320 requests: the server's mean TPOT 20 ms and mean E2E 1.5 s; no new TTFT observations.
    after = {
        f"{tpot}_sum": 1.0 + 320 * 0.020,
        f"{tpot}_count": 330.0,
        f"{e2e}_sum": 5.0 + 320 * 1.5,
        f"{e2e}_count": 330.0,
    }
    client = {"mean_ttft_s": 0.2, "mean_tpot_s": 0.022, "mean_e2e_s": 1.5}
    view = fidelity.server_view(client, before, after)
    assert view["server_tpot_mean_s"] == pytest.approx(0.020)
    assert view["tpot_over_server"] == pytest.approx(1.1)  # the client read 10 % slower
    assert view["e2e_over_server"] == pytest.approx(1.0)
    assert "ttft_over_server" not in view and "server_ttft_mean_s" not in view
    assert math.isnan(view["prefix_cache_hit_rate"])  # nothing queried


def test_own_prompts_give_vllm_bench_its_random_dataset() -> None:
    args = argparse.Namespace(input_len=256, output_len=64)
    argv = fidelity.dataset_argv(args, None)
    assert argv[argv.index("--dataset-name") + 1] == "random"
    assert argv[argv.index("--random-input-len") + 1] == "256"
