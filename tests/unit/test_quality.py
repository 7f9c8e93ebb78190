"""The quality gate's pure parts: agreement math, scoring, format checks, the gate and its
constraint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fakes.quality_items import item, out, run
from tuner.config import ParamSpec, SloConfig
from tuner.measurement.stats import measure
from tuner.quality import (
    FORMAT_CHECKS,
    QualityConfig,
    QualityItem,
    QualityOutputs,
    QualityResult,
    agreement,
    attach_quality,
    context_excess,
    drops,
    format_ok,
    gate_applies,
    is_correct,
    load_items,
    quality_attrs,
    quality_line,
    score,
)
from tuner.scoring.objective import NO_DATA_VIOLATION, UNSET_SLO, ObjectiveContext, get_constraint

NO_TRAFFIC = measure([], 0.0, 1.0, SloConfig())  # the gate never reads the measurements


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


def _files(
    tmp_path: Path, base_tokens: list[int], cand_tokens: list[int]
) -> tuple[QualityOutputs, Path]:
    """The baseline as the study storage gives it back (JSON records), the candidate's file."""
    items = load_items()
    base = run(*(out(i, base_tokens, "x") for i in items))
    cand = run(*(out(i, cand_tokens, "x") for i in items))
    cand.write(tmp_path / "cand.jsonl")
    stored = json.loads(json.dumps(base.to_records()))
    return QualityOutputs.from_records(stored), tmp_path / "cand.jsonl"


@pytest.mark.parametrize(("tolerance", "feasible"), [(0.2, False), (0.3, True)])
def test_attach_quality_feeds_the_constraint(
    tmp_path: Path, tolerance: float, feasible: bool
) -> None:
    base, cand = _files(tmp_path, [1, 2, 3, 4], [1, 2, 3, 0])  # every item: agreement 0.75
    q = QualityConfig(tolerance=tolerance, metrics=["token_agreement"])
    ran = QualityResult(outputs=str(cand), items=13)
    quality = attach_quality(ran, base, q, applies=True)
    assert quality.drops == {"token_agreement": pytest.approx(0.25)}
    violation = get_constraint("quality_vs_baseline").violation(
        NO_TRAFFIC, ObjectiveContext(quality_excess=context_excess(quality))
    )
    assert violation == pytest.approx(0.25 - tolerance) and (violation <= 0) is feasible
    assert ("OVER" in quality_line(quality)) is not feasible
    attrs = quality_attrs(quality)
    assert attrs["q_token_agreement"] == pytest.approx(0.75) and attrs["quality_gated"]
    assert attrs["quality_outputs"] == str(cand) and quality_attrs(None) == {}
    # JSON-ready for result.json and user attrs, and read back the same
    assert QualityResult.from_dict(json.loads(json.dumps(quality.to_dict()))) == quality


def test_attach_quality_without_data_is_violated_only_when_gated(tmp_path: Path) -> None:
    base, cand = _files(tmp_path, [1], [1])
    q = QualityConfig()
    ran = QualityResult(outputs=str(cand))
    no_base = attach_quality(ran, None, q, applies=True)
    assert no_base.excess == {} and context_excess(no_base) == {}
    assert "no baseline outputs" in no_base.note and "GATE HAS NO DATA" in quality_line(no_base)
    gone = QualityResult(outputs=str(tmp_path / "gone.jsonl"))
    unreadable = attach_quality(gone, base, q, applies=True)
    assert "cannot be read" in unreadable.note and context_excess(unreadable) == {}
    assert "ran no quality set" in attach_quality(QualityResult(), base, q, applies=True).note
    not_gated = attach_quality(ran, base, q, applies=False)
    assert context_excess(not_gated) is None and not_gated.drops["token_agreement"] == 0.0
