"""The quality gate's pure parts: scoring math, format checks, quality-set parsing, constraint."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import numpy as np
import pytest

from tuner.config import ParamSpec, SloConfig
from tuner.errors import ArtifactError, ConfigError
from tuner.loadgen.base import Target
from tuner.measure import measure
from tuner.objective import NO_DATA_VIOLATION, UNSET_SLO, ObjectiveContext, get_constraint
from tuner.quality import (
    DEFAULT_SET,
    FORMAT_CHECKS,
    QualityConfig,
    QualityItem,
    QualityOutput,
    QualityOutputs,
    agreement,
    attach_quality,
    check_config,
    context_excess,
    drops,
    format_ok,
    gate_applies,
    is_correct,
    load_items,
    quality_attrs,
    quality_fingerprint,
    quality_line,
    run_quality_set,
    score,
)
from tuner.quality.items import parse_item
from tuner.quality.runner import SKIPPED, parse_response, request_body

NO_TRAFFIC = measure([], 0.0, 1.0, SloConfig())  # the gate never reads the measurements


def item(id: str = "a", **kw: object) -> QualityItem:
    return QualityItem(id=id, prompt=str(kw.pop("prompt", f"prompt {id}")), **kw)  # type: ignore[arg-type]


def out(it: QualityItem, tokens: list[int] | None, text: str = "", **kw: object) -> QualityOutput:
    return QualityOutput(it.id, it.digest, text=text, token_ids=tokens, **kw)  # type: ignore[arg-type]


def run(*rows: QualityOutput) -> QualityOutputs:
    return QualityOutputs(list(rows))


# -- agreement math ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "prefix", "overall"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 1.0, 1.0),
        ([1, 2, 3, 4], [1, 2, 9, 4], 0.5, 0.75),  # diverges at token 2, re-agrees at 3
        ([5, 2, 3, 4], [1, 2, 3, 4], 0.0, 0.75),
        ([1, 2], [1, 2, 3, 4], 0.5, 0.5),  # the longer length is the denominator
        ([], [], 1.0, 1.0),
        ([], [1], 0.0, 0.0),
    ],
)
def test_agreement_prefix_and_positionwise(
    a: list[int], b: list[int], prefix: float, overall: float
) -> None:
    assert agreement(a, b) == (pytest.approx(prefix), pytest.approx(overall))
    assert agreement(b, a) == agreement(a, b)  # symmetric


def test_agreement_matches_numpy_on_random_sequences() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        x, y = rng.integers(0, 3, rng.integers(1, 40)), rng.integers(0, 3, rng.integers(1, 40))
        n, m = max(len(x), len(y)), min(len(x), len(y))
        diff = np.flatnonzero(x[:m] != y[:m])
        first = diff[0] if len(diff) else m
        same = (x[:m] == y[:m]).sum()
        assert agreement(x, y) == (pytest.approx(first / n), pytest.approx(same / n))


# -- scoring -------------------------------------------------------------------------------


def test_score_against_baseline_by_hand() -> None:
    a, b, c = item("a"), item("b"), item("c", long=True)
    base = run(out(a, [1, 2, 3, 4]), out(b, [1, 2, 3, 4]), out(c, [7, 7, 7, 7]))
    cand = run(out(a, [1, 2, 3, 4]), out(b, [1, 9, 3, 4]), out(c, [7, 7, 0, 0]))
    s = score(cand, base, [a, b, c])
    assert (s.items, s.errors, s.compared) == (3, 0, 3)
    assert s.exact_match_rate == pytest.approx(1 / 3)
    assert s.prefix_agreement == pytest.approx((1 + 0.25 + 0.5) / 3)
    assert s.token_agreement == pytest.approx((1 + 0.75 + 0.5) / 3)
    assert s.long_input_consistency == pytest.approx(0.5)
    assert s.format_compliance is None and s.accuracy is None  # no item asks for them
    assert score(base, base, [a, b, c]).token_agreement == 1.0


def test_failed_candidate_scores_zero_failed_baseline_is_left_out() -> None:
    a, b = item("a", reference=("x",)), item("b")
    base = run(out(a, [1, 2]), out(b, None, error="HTTP 500: boom"))
    cand = run(out(a, None, error="ReadTimeout: slow"), out(b, [1, 2]))
    s = score(cand, base, [a, b])
    assert s.errors == 1 and s.compared == 1
    assert s.token_agreement == 0.0 and s.exact_match_rate == 0.0
    assert s.accuracy == 0.0


def test_changed_prompt_is_not_compared_and_missing_row_is_an_error() -> None:
    a = item("a")
    changed = QualityItem("a", "another prompt")
    s = score(run(out(a, [1])), run(out(changed, [1])), [a])
    assert s.compared == 0 and s.token_agreement is None
    missing = score(run(), run(out(a, [1])), [a])
    assert missing.errors == 1 and missing.token_agreement == 0.0


def test_characters_are_compared_when_token_ids_are_missing() -> None:
    a = item("a")
    s = score(run(out(a, None, "abcd")), run(out(a, [1, 2], "abxd")), [a])
    assert s.token_agreement == pytest.approx(0.75) and s.prefix_agreement == pytest.approx(0.5)


def test_long_inputs_by_flag_or_by_prompt_length() -> None:
    short, flagged = item("s"), item("f", long=True)
    base = run(out(short, [1, 2], prompt_tokens=2000), out(flagged, [1, 2], prompt_tokens=10))
    cand = run(out(short, [1, 0], prompt_tokens=2000), out(flagged, [1, 2], prompt_tokens=10))
    assert score(cand, base, [short, flagged]).long_input_consistency == 1.0
    by_len = score(cand, base, [short, flagged], long_input_tokens=1024)
    assert by_len.long_input_consistency == pytest.approx(0.75)


def test_format_and_accuracy_rates() -> None:
    j = item("j", format="json")
    r = item("r", format="regex", pattern=r"^\s*\d{4}-\d{2}-\d{2}\b", reference=("1969-07-20",))
    k = item("k", reference=("Paris",))
    cand = run(out(j, [1], ' {"a": 1} and then'), out(r, [1], " 1969-07-21"), out(k, [1], "paris!"))
    s = score(cand, None, [j, r, k])
    assert s.format_compliance == 1.0  # both formatted items comply
    assert s.accuracy == pytest.approx(0.5)  # wrong date, right capital
    assert s.token_agreement is None and s.compared == 0  # no baseline
    assert "per_item" not in s.to_dict() and len(s.to_dict(per_item=True)["per_item"]) == 3


# -- format checks and reference matchers --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "ok"),
    [
        ("json", '{"name": "Ada", "born": 1815}', True),
        ("json", "  [1, 2]\n\nand more text", True),  # ignore_eos keeps generating
        ("json", '```json\n{"a": 1}\n```', True),
        ("json", 'Sure! {"a": 1}', False),
        ("json", "1 is a number", False),  # an object or an array
        ("json", '{"a": 1', False),
        ("json_strict", ' {"a": 1}\n', True),
        ("json_strict", '{"a": 1} trailing', False),
        ("regex", " 2024-01-31 is the date", True),
        ("regex", "on 2024-01-31", False),  # the pattern is anchored with ^
    ],
)
def test_format_checks(name: str, text: str, ok: bool) -> None:
    pattern = r"^\s*\d{4}-\d{2}-\d{2}\b" if name == "regex" else None
    assert format_ok(text, item(format=name, pattern=pattern)) is ok
    assert set(FORMAT_CHECKS) >= {"json", "json_strict", "regex"}


def test_no_format_and_no_reference_are_none() -> None:
    assert format_ok("x", item()) is None and is_correct("x", item()) is None


@pytest.mark.parametrize(
    ("match", "text", "ok"),
    [
        ("prefix", "  PARIS is the capital", True),
        ("prefix", "It is Paris", False),
        ("contains", "It is   paris.", True),
        ("exact", " Paris ", True),
        ("exact", "Paris.", False),
    ],
)
def test_reference_matchers_ignore_case_and_whitespace(match: str, text: str, ok: bool) -> None:
    assert is_correct(text, item(reference=("Paris",), match=match)) is ok


def test_any_of_several_references() -> None:
    it = item(reference=("42", "forty-two"))
    assert is_correct(" Forty-two.", it) and not is_correct("41", it)


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


# -- the gate and the constraint -----------------------------------------------------------


def test_drops_use_one_for_agreement_and_baseline_for_absolute_metrics() -> None:
    a = item("a", format="json", reference=("1",))
    base = run(out(a, [1, 2], '{"a": 1}'))
    cand = run(out(a, [1, 3], "1 no json"))
    base_self, cand_s = score(base, base, [a]), score(cand, base, [a])
    d = drops(cand_s, base_self, ["token_agreement", "format_compliance", "accuracy"])
    assert d == {"token_agreement": 0.5, "format_compliance": 1.0, "accuracy": -1.0}
    assert drops(cand_s, base_self, ["long_input_consistency"]) == {}  # no long item


@pytest.mark.parametrize(
    ("excess", "expected"),
    [
        (None, UNSET_SLO),  # the gate does not apply: satisfied
        ({}, NO_DATA_VIOLATION),  # it applies but nothing was compared: violated
        ({"token_agreement": 0.2, "accuracy": -0.1}, 0.2),
        ({"token_agreement": -0.05}, -0.05),
        ({"token_agreement": 0.0}, 0.0),  # a drop equal to the tolerance passes (<= 0)
    ],
)
def test_constraint_sign(excess: dict[str, float] | None, expected: float) -> None:
    ctx = ObjectiveContext(quality_excess=excess)
    assert get_constraint("quality_vs_baseline").violation(NO_TRAFFIC, ctx) == expected


def test_gate_applies_by_stage_name_or_precision_param() -> None:
    q = QualityConfig()
    cat = ParamSpec(type="categorical", choices=["auto", "fp8"])
    assert gate_applies(q, "quantization", {})
    assert gate_applies(q, "joint", {"max_num_seqs": ParamSpec(), "kv_cache_dtype": cat})
    assert gate_applies(q, "custom", {"kv": ParamSpec(type="categorical", name="kv_cache_dtype")})
    assert not gate_applies(q, "batching", {"max_num_seqs": ParamSpec()})
    assert not gate_applies(QualityConfig(enabled=False), "quantization", {"dtype": cat})


def _files(tmp_path: Path, base_tokens: list[int], cand_tokens: list[int]) -> tuple[Path, Path]:
    items = load_items()
    base = run(*(out(i, base_tokens, "x") for i in items))
    cand = run(*(out(i, cand_tokens, "x") for i in items))
    base.write(tmp_path / "base.jsonl")
    cand.write(tmp_path / "cand.jsonl")
    return tmp_path / "base.jsonl", tmp_path / "cand.jsonl"


@pytest.mark.parametrize(("tolerance", "feasible"), [(0.2, False), (0.3, True)])
def test_attach_quality_feeds_the_constraint(
    tmp_path: Path, tolerance: float, feasible: bool
) -> None:
    base, cand = _files(tmp_path, [1, 2, 3, 4], [1, 2, 3, 0])  # every item: agreement 0.75
    q = QualityConfig(tolerance=tolerance, metrics=["token_agreement"])
    quality = attach_quality({"outputs": str(cand), "items": 13}, base, q, applies=True)
    assert quality["drops"] == {"token_agreement": pytest.approx(0.25)}
    violation = get_constraint("quality_vs_baseline").violation(
        NO_TRAFFIC, ObjectiveContext(quality_excess=context_excess(quality))
    )
    assert violation == pytest.approx(0.25 - tolerance) and (violation <= 0) is feasible
    assert ("OVER" in quality_line(quality)) is not feasible
    attrs = quality_attrs(quality)
    assert attrs["q_token_agreement"] == pytest.approx(0.75) and attrs["quality_gated"]
    assert attrs["quality_outputs"] == str(cand) and quality_attrs({}) == {}
    json.dumps(quality)  # JSON-ready for result.json and user attrs


def test_attach_quality_without_data_is_violated_only_when_gated(tmp_path: Path) -> None:
    base, cand = _files(tmp_path, [1], [1])
    q = QualityConfig()
    no_base = attach_quality({"outputs": str(cand)}, None, q, applies=True)
    assert no_base["excess"] == {} and context_excess(no_base) == {}
    assert "no baseline outputs" in no_base["note"] and "GATE HAS NO DATA" in quality_line(no_base)
    unreadable = attach_quality({"outputs": str(tmp_path / "gone.jsonl")}, base, q, applies=True)
    assert "cannot be read" in unreadable["note"] and context_excess(unreadable) == {}
    assert "ran no quality set" in attach_quality({}, base, q, applies=True)["note"]
    not_gated = attach_quality({"outputs": str(cand)}, base, q, applies=False)
    assert context_excess(not_gated) is None and not_gated["drops"]["token_agreement"] == 0.0


# -- outputs and requests ------------------------------------------------------------------


def test_outputs_round_trip_and_read_errors(tmp_path: Path) -> None:
    a = item("a")
    outputs = run(out(a, [1, 2], "hi", prompt_tokens=3), out(item("b"), None, error="HTTP 400: x"))
    outputs.write(tmp_path / "q.jsonl")
    back = QualityOutputs.read(tmp_path / "q.jsonl")
    assert back.rows == outputs.rows and back.errors == 1
    assert back.by_id()["a"].token_ids == [1, 2]
    assert outputs.summary()["first_error"] == "b: HTTP 400: x"
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
    ok = {"choices": [{"text": " hi", "token_ids": [5, 6], "finish_reason": "length"}],
          "usage": {"prompt_tokens": 4}}  # fmt: skip
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
