"""A hand-over that meets an SLO by less than its windows' spread says so in the summary: a
point just over the SLO reads under it as often, and only more windows tell the two apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_study import Scripted
from tuner.scoring.feasibility import Edge, edges
from tuner.study.session import outcome_lines
from tuner.study.stages import Incumbent, StudyResult

NAMES = ["p99_e2e_latency", "output_throughput"]


def test_edges_by_hand() -> None:
    windows = [
        {"slo_p99_tpot": -0.02, "slo_p99_ttft": -0.21, "err": 0.0},
        {"slo_p99_tpot": 0.01, "slo_p99_ttft": -0.20, "err": 0.0},
        {"slo_p99_tpot": -0.005, "slo_p99_ttft": -0.19, "err": 0.0},
    ]
    # TPOT: levels 0.98, 1.01, 0.995: mean margin 0.005, SD 0.015 (a third of one); TTFT's
    # margin is twenty SDs; the error rate never moved.
    (edge,) = edges(windows)
    assert (edge.name, edge.windows, edge.df) == ("slo_p99_tpot", 3, 2)
    assert edge.margin == pytest.approx(0.005) and edge.spread == pytest.approx(0.015)
    assert edge.miss_chance == pytest.approx(0.3694, abs=1e-4)  # Phi(-1/3)
    assert edge.line() == (
        "slo_p99_tpot met by 0.5% on the mean of 3 windows, where repeated windows spread 1.5% "
        "(SD over 2 df): a fresh window misses it about 37% of the time"
    )
    # one window has no spread to judge by; a constraint missed on the mean is a miss, no edge
    assert edges(windows[:1]) == []
    assert edges([{"slo_p99_tpot": 0.02}, {"slo_p99_tpot": -0.01}]) == []


def test_the_spread_is_pooled_over_the_studys_other_repeated_configurations() -> None:
    """Two windows that agree (4 % under) prove nothing on their own: another configuration's
    windows, 10 % apart, put one window's CV at 5 % (pooled over 2 df: 0 and 7.07 %); at the
    final's level that is 4.8 %, more than its margin."""
    final = [{"slo_p99_tpot": -0.04}, {"slo_p99_tpot": -0.04}]
    other = [{"slo_p99_tpot": -0.05}, {"slo_p99_tpot": 0.05}]
    assert edges(final) == []
    (edge,) = edges(final, [other])
    assert edge.spread == pytest.approx(0.05 * 0.96) and edge.df == 2
    assert edge.margin == pytest.approx(0.04)
    # far under the SLO, the same CV is no edge
    assert edges([{"slo_p99_tpot": -0.3}] * 2, [other]) == []


def test_the_summary_names_an_edge_and_not_a_clear_margin() -> None:
    base = Incumbent({}, [0.9, 1000.0], {}, "baseline", [1000.0])
    windows = [{"slo_p99_tpot": -0.03}, {"slo_p99_tpot": 0.01}]
    edge = Incumbent(
        {"tp": 4},
        [0.8, 1200.0],
        {"slo_p99_tpot": -0.01},
        "batching trial 2",
        [1200.0, 1190.0],
        windows,
    )
    lines = outcome_lines("q", NAMES, 1, StudyResult(base, edge))
    assert lines[-1] == (
        f"  ON AN SLO'S EDGE: {Edge('slo_p99_tpot', 0.01, 0.02 * 2**0.5, 2, 1).line()}; more "
        "windows (study.repeats) tell it from a miss"
    )
    clear = [{"slo_p99_tpot": -0.30}, {"slo_p99_tpot": -0.32}]
    far = Incumbent(
        {"tp": 4}, [0.8, 1200.0], {"slo_p99_tpot": -0.31}, "batching trial 2", [1200.0], clear
    )
    assert not any("EDGE" in line for line in outcome_lines("q", NAMES, 1, StudyResult(base, far)))


def test_a_study_hands_over_the_windows_its_decision_was_judged_on(tmp_path: Path) -> None:
    """The winner's P99 reads 2.3 s in its search window, then 2.7 and 2.4 s, against a 2.6 s
    SLO. Its fresh windows alone judge its constraints (the search window is the draw that read
    best): met on their mean by 1.9 %, one of the two over. The hand-over carries those two
    windows, and the summary says the SLO is on its edge."""
    run = Scripted(
        tmp_path,
        {
            None: [(1000, 3.0)] * 3,
            16: [(800, 2.9)],
            64: [(900, 2.3), (900, 2.7), (900, 2.4)],
        },
    )
    final = run.result.final
    assert final.params == {"max_num_seqs": 64}
    p99 = [w["slo_p99_e2e"] for w in final.constraint_windows]
    assert p99 == pytest.approx([2.7 / 2.6 - 1, 2.4 / 2.6 - 1])
    (decision,) = run.result.decisions
    assert decision.candidate_constraint_windows == final.constraint_windows
    assert len(decision.incumbent_constraint_windows) == 3  # the baseline's window and 2 repeats
    lines = outcome_lines("t", ["p99_e2e_latency", "output_throughput"], 1, run.result)
    assert lines[-1].startswith("  ON AN SLO'S EDGE: slo_p99_e2e met by 1.9% on the mean of 2")
    # pooled with the incumbent's three windows, which agree: 3 df
    assert "(SD over 3 df)" in lines[-1]
