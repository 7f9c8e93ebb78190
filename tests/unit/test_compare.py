"""`tuner compare`'s judgement on known numbers: the interleaved order, the ratio's
interval, and the acceptance rule's decision both ways. Real endpoints:
tests/integration/test_compare_endpoint.py (fake SSE servers) and
tests/e2e/test_deployment_vllm.py (real vLLM)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tuner.composition import compose
from tuner.config import SloConfig
from tuner.deployment.compare import (
    BETTER,
    SAME,
    UNRESOLVED,
    WORSE,
    CompareResult,
    class_ratios,
    more_rounds,
    ratio_of,
    table,
    window_order,
)
from tuner.measurement.stats import ClassStats, Measurements, MetricStats, measure
from tuner.study.decision.noise import NoiseEstimate


def test_windows_alternate_which_side_goes_first() -> None:
    assert "".join(window_order(4)) == "ABBAABBA"
    sides = window_order(5)
    assert sides.count("A") == sides.count("B") == 5


@pytest.mark.parametrize(
    ("b", "direction", "decision"),
    [
        ([1500.0, 1480.0, 1510.0, 1490.0], "maximize", BETTER),
        ([700.0, 720.0, 690.0, 710.0], "maximize", WORSE),
        ([1005.0, 995.0, 1012.0, 990.0], "maximize", SAME),
        ([700.0, 720.0, 690.0, 710.0], "minimize", BETTER),  # lower latency is better
    ],
)
def test_the_decision_is_the_acceptance_rule_both_ways(
    b: list[float], direction: str, decision: str
) -> None:
    a = [1000.0, 1010.0, 990.0, 1003.0]
    r = ratio_of("x", direction, a, b, 0.02)
    assert r.decision == decision and r.resolution < 0.2
    assert r.ratio == pytest.approx(np.mean(b) / np.mean(a))
    assert r.low < r.ratio < r.high and r.noise_df == 6
    # The interval leaves out 1 exactly when the rule decides.
    assert (r.low > 1 or r.high < 1) == (decision != SAME)


def test_a_wide_interval_is_unresolved_not_the_same_and_says_what_would_resolve_it() -> None:
    r = ratio_of("x", "maximize", [1000.0, 1300.0], [1200.0, 1500.0], 0.02)
    assert r.ratio > 1.1 and r.low < 1.0 and r.decision == UNRESOLVED
    assert r.resolution > 0.2 and r.needs is not None
    assert r.label == f"unresolved (needs {r.needs} more windows of each)"
    grown = NoiseEstimate(r.noise_rel_sd, r.noise_df + 2 * r.needs)
    assert grown.resolution(2 + r.needs, 2 + r.needs) <= 0.2
    assert more_rounds([r], 2, 2 + r.needs) == r.needs and more_rounds([r], 2, 1 + r.needs) == 0


def test_the_interval_is_the_rules_threshold_as_a_factor() -> None:
    a, b = [100.0, 110.0, 90.0], [200.0, 220.0, 180.0]
    r = ratio_of("x", "maximize", a, b, 0.0)
    factor = 1 + NoiseEstimate.of(a, b).threshold(3, 3, 1.0)
    assert (r.low, r.high) == pytest.approx((2.0 / factor, 2.0 * factor))
    assert math.sqrt(r.low * r.high) == pytest.approx(2.0)


def test_missing_values_give_no_decision() -> None:
    r = ratio_of("x", "maximize", [100.0, math.nan], [100.0, 101.0], 0.02)
    assert r.decision == UNRESOLVED and math.isnan(r.ratio)


def test_an_unresolved_row_says_whether_more_windows_could_resolve_it() -> None:
    """A known noise too wide for the asked resolution within any number of windows says so;
    only a row with no noise at all reads "noise unknown"."""
    wide = ratio_of("x", "maximize", [1000.0, 1300.0], [1300.0, 1000.0], 0.02, 0.0001)
    assert wide.decision == UNRESOLVED and wide.needs is None
    assert math.isfinite(wide.resolution)
    assert wide.label == "unresolved (more windows cannot resolve it)"
    assert replace(wide, resolution=math.inf).label == "unresolved (noise unknown)"


def _class_window(ttft_p99: float, tok_s: float) -> Measurements:
    chat = MetricStats(n=80, p50=ttft_p99 / 2, p99=ttft_p99)
    stats = ClassStats(chat, chat, chat, 80, 80, 0, 0.0, tok_s, 8.0)
    m = measure([], 0.0, 10.0, SloConfig())  # an empty window's totals, then this class's own
    return replace(m, by_class={"chat": stats}, output_throughput=1000.0)


def test_a_class_that_b_makes_worse_exits_1_though_the_totals_agree() -> None:
    config = compose(["workload=chat_and_documents"])
    sides = window_order(3)
    chat_ttft = {"A": [0.30, 0.31, 0.29], "B": [0.61, 0.60, 0.62]}  # B doubles chat's tail
    windows = [_class_window(chat_ttft[s].pop(), 500.0) for s in sides]
    classes = class_ratios(config, sides, windows)
    assert list(classes) == ["chat", "documents"]
    chat = {r.objective: r for r in classes["chat"]}
    assert chat["p99_ttft"].decision == WORSE and chat["p99_ttft"].ratio == pytest.approx(2, 0.05)
    # documents sent nothing in these windows: nothing to compare, never "the same"
    assert {r.decision for r in classes["documents"]} == {UNRESOLVED}
    total = ratio_of("output_throughput", "maximize", [1000.0] * 3, [1000.0] * 3, 0.0)
    result = CompareResult("a", "b", sides, windows, [total], 1.0, classes)
    assert total.decision != WORSE and result.exit_code == 1
    assert "chat: p99_ttft" in table(result) and result.to_dict()["classes"]["chat"]
    one = compose(["workload=open_loop"])
    assert len(one.workload.classes) == 1 and class_ratios(one, sides, windows) == {}
