"""The quality gate's inputs and outputs: quality-set parsing, the answers file, requests and
responses, an unreachable server, the fingerprint."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest

from tests.fakes.quality_items import item, out, run
from tuner.errors import ArtifactError, ConfigError
from tuner.loadgen.generator import Target
from tuner.quality import (
    DEFAULT_SET,
    QualityConfig,
    QualityOutput,
    QualityOutputs,
    check_config,
    load_items,
    quality_fingerprint,
    run_quality_set,
    score,
)
from tuner.quality.collect import SKIPPED, parse_response, request_body
from tuner.quality.items import parse_item

# -- parsing a quality set ---------------------------------------------------------------


def test_default_set_loads_and_covers_every_check() -> None:
    items = load_items(None)
    assert items == load_items(DEFAULT_SET) and 10 <= len(items) <= 16
    assert {i.format for i in items} >= {"json", "regex"}
    assert sum(bool(i.reference) for i in items) >= 3
    assert sum(i.long for i in items) == 2 and {i.api for i in items} == {"completions", "chat"}


def test_parse_item_full_line() -> None:
    line = '{"id": 7, "prompt": "p", "api": "chat", "max_tokens": 8, "reference": ["a", "b"]}'
    it = parse_item(line, "f:1")
    assert (it.id, it.api, it.max_tokens, it.reference) == ("7", "chat", 8, ("a", "b"))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "a", "prompt": ', "f:3: not valid JSON"),
        ('["a", "b"]', "f:3: expected a JSON object"),
        ('{"id": "a"}', "'id' and 'prompt' (a string) are required"),
        ('{"id": "a", "prompt": "p", "answer": "x"}', "unknown key(s) answer"),
        ('{"id": "a", "prompt": "p", "api": "embed"}', "api='embed' is unknown"),
        ('{"id": "a", "prompt": "p", "format": "yaml"}', "format='yaml' is unknown (known: json"),
        ('{"id": "a", "prompt": "p", "format": "regex"}', "format 'regex' needs a 'pattern'"),
        ('{"id": "a", "prompt": "p", "format": "regex", "pattern": "("}', "bad regex pattern"),
        ('{"id": "a", "prompt": "p", "match": "fuzzy"}', "match='fuzzy' is unknown"),
        ('{"id": "a", "prompt": "p", "max_tokens": 0}', "max_tokens must be an integer >= 1"),
        ('{"id": "a", "prompt": "p", "reference": 4}', "'reference' must be a string"),
        ('{"id": "a", "prompt": "p", "long": "yes"}', "'long' must be true or false"),
    ],
)
def test_bad_lines_name_file_line_and_problem(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_item(line, "f:3")
    assert message in err.value.one_line() and err.value.one_line().startswith("f:3")


def test_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"id": "a", "prompt": "p"}\n\n{"id": "a", "prompt": "q"}\n')
    with pytest.raises(ConfigError, match="duplicate id"):
        load_items(path)
    path.write_text("\n  \n")
    with pytest.raises(ConfigError, match="has no prompts"):
        load_items(path)
    path.write_text('{"id": "a", "prompt": "p"}\n{"id": "b", "prompt": 3}\n')
    with pytest.raises(ConfigError, match=r"set.jsonl:2: 'id' and 'prompt'"):
        load_items(path)
    with pytest.raises(ConfigError, match="cannot be read") as err:
        load_items(tmp_path / "missing.jsonl")
    assert "quality.prompts" in err.value.one_line()


def test_check_config_rejects_unknown_metrics_and_negative_tolerance() -> None:
    assert len(check_config(QualityConfig())) == len(load_items())
    assert check_config(QualityConfig(enabled=False, prompts="/nope")) == []
    with pytest.raises(ConfigError, match=r"unknown metric.*bleu"):
        check_config(QualityConfig(metrics=["token_agreement", "bleu"]))
    with pytest.raises(ConfigError, match="tolerances must be >= 0"):
        check_config(QualityConfig(tolerances={"accuracy": -0.1}))


# -- outputs and requests ------------------------------------------------------------------


def test_outputs_round_trip_and_read_errors(tmp_path: Path) -> None:
    a = item("a")
    outputs = run(out(a, [1, 2], "hi", prompt_tokens=3), out(item("b"), None, error="HTTP 400: x"))
    outputs.write(tmp_path / "q.jsonl")
    back = QualityOutputs.read(tmp_path / "q.jsonl")
    assert back.rows == outputs.rows and back.errors == 1
    assert back.by_id()["a"].token_ids == [1, 2]
    assert outputs.summary().first_error == "b: HTTP 400: x"
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(ArtifactError, match="cannot be read"):
        QualityOutputs.read(tmp_path / "bad.jsonl")


def test_request_body_is_greedy_fixed_length_with_token_ids() -> None:
    target = Target("http://h:1", None, "m", "m")
    body = request_body(target, QualityConfig(max_tokens=16), item(api="chat"), "salt")
    assert body["temperature"] == 0.0 and body["max_tokens"] == 16 and body["ignore_eos"]
    assert body["return_token_ids"] and body["cache_salt"] == "salt" and not body["stream"]
    assert body["messages"] == [{"role": "user", "content": "prompt a"}]
    assert request_body(target, QualityConfig(), item(max_tokens=3), "s")["prompt"] == "prompt a"
    assert request_body(target, QualityConfig(), item(max_tokens=3), "s")["max_tokens"] == 3


def test_parse_response_shapes() -> None:
    a, chat = item("a"), item("c", api="chat")
    row = QualityOutput("a", a.digest)
    ok = {
        "choices": [{"text": " hi", "token_ids": [5, 6], "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4},
    }
    parse_response(200, json.dumps(ok), a, row)
    assert (row.text, row.token_ids, row.prompt_tokens, row.ok) == (" hi", [5, 6], 4, True)
    row = QualityOutput("c", chat.digest)
    parse_response(200, json.dumps({"choices": [{"message": {"content": "x"}}]}), chat, row)
    assert row.text == "x" and row.token_ids is None and row.prompt_tokens is None
    err = {"error": {"message": "This model's maximum context length is 2048\nmore"}}
    row = QualityOutput("a", a.digest)
    parse_response(400, json.dumps(err), a, row)
    assert row.error == "HTTP 400: This model's maximum context length is 2048"
    row = QualityOutput("a", a.digest)
    parse_response(200, "<html>", a, row)
    assert row.error.startswith("unexpected response (JSONDecodeError")


def test_unreachable_server_gives_error_rows_and_skips_the_rest(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = Target(f"http://127.0.0.1:{port}", "key", "m", "m")
    items = [item(str(n)) for n in range(4)]
    q = QualityConfig(request_timeout_s=2)
    outputs = run_quality_set(target, q, tmp_path / "q.jsonl", items)
    assert [r.error.split(":")[0] for r in outputs.rows[:2]] == ["ConnectionError"] * 2
    assert all(r.error == SKIPPED for r in outputs.rows[2:])
    assert all("\n" not in r.error for r in outputs.rows)
    assert QualityOutputs.read(tmp_path / "q.jsonl").errors == 4
    assert not math.isnan(outputs.seconds)


def test_answers_generated_with_other_settings_are_not_compared() -> None:
    a = item("a")
    base = run(QualityOutput("a", a.digest, "max_tokens=64 ignore_eos=True", token_ids=[1]))
    same = run(QualityOutput("a", a.digest, "max_tokens=64 ignore_eos=True", token_ids=[2]))
    other = run(QualityOutput("a", a.digest, "max_tokens=32 ignore_eos=True", token_ids=[1]))
    assert score(same, base, [a]).compared == 1
    assert score(other, base, [a]).compared == 0


def test_fingerprint_changes_with_the_set_and_settings(tmp_path: Path) -> None:
    default = quality_fingerprint(QualityConfig())
    assert default is not None and default["items"] == len(load_items())
    assert quality_fingerprint(QualityConfig()) == default  # stable
    assert quality_fingerprint(QualityConfig(max_tokens=8)) != default
    path = tmp_path / "set.jsonl"
    path.write_text('{"id": "a", "prompt": "p"}\n')
    assert quality_fingerprint(QualityConfig(prompts=str(path))) != default
    assert quality_fingerprint(QualityConfig(enabled=False)) is None
