"""How a refusal by vLLM reads: the flags its reason is about, on one line; and a server that
did fail at start-up shows its root cause and log path, never argparse's usage text. (vLLM's
own checks, run for real: tests/integration/test_validate_config.py.)"""

from __future__ import annotations

from pathlib import Path

from tuner.plan.validate import explain, flag_values
from tuner.server.vllm import classify_failure, root_cause, without_usage
from tuner.server.vllm_engine_config import ConfigProblem, ConfigRejection

DATA = Path(__file__).resolve().parents[1] / "data"
ARGV = [
    "--model",
    "/m",
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "-4",
    "--max-num-batched-tokens",
    "1714",
    "--enforce-eager",
]


def test_flag_values_keep_negative_numbers_as_values() -> None:
    assert flag_values(ARGV) == {
        "--model": "/m",
        "--max-model-len": "2048",
        "--max-num-seqs": "-4",
        "--max-num-batched-tokens": "1714",
        "--enforce-eager": "",
    }


def test_a_field_error_names_the_flag_the_user_set_and_drops_what_vllm_derived() -> None:
    refused = ConfigRejection(
        "SchedulerConfig",
        (
            ConfigProblem("max_num_batched_tokens", "must be >= 1 (got -16384)"),
            ConfigProblem("max_num_seqs", "must be >= 1 (got -4)"),
        ),
    )
    argv = ["--model", "/m", "--max-num-seqs", "-4"]
    got = explain(refused, argv)
    assert got.flags == ("--max-num-seqs -4",)
    assert got.line() == (
        "vLLM rejects --max-num-seqs -4: SchedulerConfig: max_num_seqs: must be >= 1 (got -4)"
    )


def test_a_whole_config_error_names_the_flags_its_words_mention() -> None:
    words = "max_num_batched_tokens (1714) is smaller than max_model_len (2048)."
    got = explain(ConfigRejection("SchedulerConfig", (ConfigProblem("", words),)), ARGV)
    assert got.flags == ("--max-model-len 2048", "--max-num-batched-tokens 1714")
    assert got.reason == f"SchedulerConfig: {words}"
    parse = ConfigRejection("argparse", (ConfigProblem("", "argument --x: invalid int"),))
    assert explain(parse, ["--x", "y"]).line() == "vLLM rejects --x y: argument --x: invalid int"
    other = explain(ConfigRejection("ValueError", (ConfigProblem("", "no GPU"),)), ARGV)
    assert other.line() == "vLLM rejects the server flags: ValueError: no GPU"


def test_a_refused_flag_at_start_up_shows_its_cause_not_the_usage_text() -> None:
    log = (DATA / "vllm_argparse_failure.log").read_text()
    assert log.count("\n") > 250 and "usage: api_server.py" in log  # what vLLM printed
    assert root_cause(log) == "argument --max-num-seqs: invalid int value: 'abc'"
    assert classify_failure(log) == "invalid_argument"
    kept = without_usage(log)
    assert "usage:" not in kept and "[--max-num-seqs MAX_NUM_SEQS]" not in kept
    assert kept.splitlines()[-1].endswith("invalid int value: 'abc'")
    assert len(kept.splitlines()) < 10
