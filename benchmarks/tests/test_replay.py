"""The replay harness (benchmarks/replay.py) on a small synthetic table: 2 params x 3 values.

The table is built so that the answer is known: throughput grows with both params, latency
too, and an SLO of 2.6 s cuts the largest configurations off; two repeats per
configuration differ by 1 %, far less than the gaps between configurations, so the full grid
must find the best feasible configuration exactly, by the grid size, whatever the seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import replay
from benchmarks.scoring import HV_AT
from tuner.testing.grid_table import DEFAULTS, GROUPS, PARAMS, write_table
from tuner.testing.landscape import Landscape, Measured, median_slo
from tuner.testing.lookup import (
    StudyStrategy,
    base_config,
    categorical_space,
    run_study,
    study_config,
)


def test_replay_on_synthetic_table(tmp_path: Path) -> None:
    table = tmp_path / "grid.csv"
    write_table(table)
    # An absent flag takes the smallest value: the staged runs start from (4, 512).
    land = Landscape.from_csv(table, PARAMS, DEFAULTS)
    strategies = [
        StudyStrategy("staged_tpe", "staged", "tpe", 3, repeats=1),
        StudyStrategy("joint_random", "joint", "random", 4, repeats=1, n_startup_trials=0),
    ]
    # The default SLO is the grid's median P99: (16, 2048) at 2.4 s. A repeat 0.5 % above it
    # would be infeasible, so the test sets 2.6 s: 5 of 9 feasible, none within 7 % of it.
    assert median_slo(land) == pytest.approx(2.4)
    result = replay.replay(land, base_config(), GROUPS, 3, strategies, slo=2.6)

    ref = result["reference"]
    assert ref["grid_size"] == 9
    assert ref["feasible_share"] == pytest.approx(5 / 9)
    assert ref["best_config"] == {"max_num_seqs": 16, "max_num_batched_tokens": 2048}

    runs = result["runs"]
    names = {"defaults", "grid", "staged_tpe", "joint_random"}
    assert {r["strategy"] for r in runs} == names
    assert len(runs) == 3 * len(names)
    for r in runs:
        assert r["launches"] >= 1
        assert 0.0 <= r["final_score"] <= 1.0 + 1e-9
        assert all(0.0 <= r[f"hv_at_{t}"] <= 1.0 + 1e-9 for t in HV_AT)
        t97 = r["trials_to_97"]
        assert t97 is None or 1 <= t97 <= r["launches"]
        # With a stored baseline the same run costs its baseline launches less, never below 0.
        b = r["baseline_launches"]
        assert b == (3 if r["strategy"] in ("staged_tpe", "joint_random") else 0)
        warm = r["trials_to_97_stored_baseline"]
        assert warm == (None if t97 is None else max(0, t97 - b))
    grid_runs = [r for r in runs if r["strategy"] == "grid"]
    for r in grid_runs:
        assert r["launches"] == 9
        assert r["final_score"] == pytest.approx(1.0)
        assert r["trials_to_97"] is not None and r["trials_to_97"] <= 9
        assert r["hv_at_20"] == pytest.approx(1.0)
    # The defaults (4, 512) are feasible but the slowest: 1000 / 1550 of the best.
    for r in runs:
        if r["strategy"] == "defaults":
            assert r["final_score"] == pytest.approx(1000 / 1550, rel=0.02)

    summary = {s["strategy"]: s for s in result["summary"]}
    assert set(summary) == names
    assert summary["grid"]["reached_97"] == "3/3"
    assert summary["grid"]["final_feasible"] == "3/3"
    assert not math.isnan(summary["staged_tpe"]["median_final_score"])
    # The budget is 10 % of 9 launches, i.e. 1; the grid walk has no baseline to store.
    assert summary["grid"]["reached_97_in_1_stored_baseline"] == summary["grid"]["reached_97_in_1"]
    staged = [r for r in runs if r["strategy"] == "staged_tpe"]
    warm_in_1 = sum(1 for r in staged if (r["trials_to_97_stored_baseline"] or 99) <= 1)
    assert summary["staged_tpe"]["reached_97_in_1_stored_baseline"] == f"{warm_in_1}/3"


def test_a_stored_baseline_saves_the_first_launches_only() -> None:
    from benchmarks.scoring import baseline_launches, without_baseline
    from tuner.testing.run_trace import Launch, RunTrace

    def trace(*labels: str) -> RunTrace:
        measured = Measured(True, "", *[1.0] * 6, 100.0, 1.0, 0.0, 10, 0)
        return RunTrace("s", 0, [Launch(label, (1,), measured) for label in labels])

    assert baseline_launches(trace("baseline", "baseline", "runtime", "runtime-confirm")) == 2
    assert baseline_launches(trace("grid", "grid")) == 0
    with pytest.raises(ValueError, match="baseline launch after the search"):
        baseline_launches(trace("baseline", "runtime", "baseline"))
    assert without_baseline(8, 3) == 5
    assert without_baseline(2, 3) == 0  # the stored baseline itself is the answer
    assert without_baseline(None, 3) is None


def test_explain_prints_every_launch_and_each_stage_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    land = Landscape.from_csv(write_table(tmp_path / "grid.csv"), PARAMS, DEFAULTS)
    strategy = StudyStrategy("staged_tpe", "staged", "tpe", 2, repeats=1)
    space = categorical_space(land, GROUPS)
    trace = run_study(land, base_config(), strategy, space, 2.6, 0)
    text = trace.explain()
    lines = text.splitlines()
    assert lines[0] == "staged_tpe seed 0:"
    assert sum(line.startswith("  baseline ") for line in lines) == 3  # baseline_measurements
    assert len([line for line in lines if " P99 " in line]) == len(trace.launches)
    assert [line.split(":")[0].strip() for line in lines if "stage " in line] == [
        "stage first",
        "stage second",
    ]


def test_the_stages_run_in_the_order_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    land = Landscape.from_csv(write_table(tmp_path / "grid.csv"), PARAMS, DEFAULTS)
    strategy = StudyStrategy("staged_tpe", "staged", "tpe", 2, repeats=1)
    reversed_groups = dict(reversed(GROUPS.items()))
    replay.explain(land, base_config(), reversed_groups, [strategy], 1, 2.6)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines if "stage " in line] == [
        "stage second",
        "stage first",
    ]
    assert replay.parse_args(["--stages", "runtime", "batching"]).stages == ["runtime", "batching"]
    assert replay.parse_args([]).stages == list(replay.GROUPS)  # the committed replays' order


def test_the_throughput_column_is_chosen_and_rows_without_it_left_out(tmp_path: Path) -> None:
    table = write_table(tmp_path / "grid.csv")
    lines = table.read_text().splitlines()
    # The second repeat of each configuration gets a token rate of 2x its tok/s; the first none.
    out = [lines[0] + ",output_token_rate"]
    for i, line in enumerate(lines[1:]):
        tok = float(line.split(",")[10])
        out.append(line + ("," if i % 2 == 0 else f",{2 * tok}"))
    table.write_text("\n".join(out) + "\n")
    by_count = Landscape.from_csv(table, PARAMS, DEFAULTS)
    by_rate = Landscape.from_csv(table, PARAMS, DEFAULTS, "output_token_rate")
    key = (64, 8192)
    assert len(by_count.table[key]) == 2 and len(by_rate.table[key]) == 1
    (only,) = by_rate.table[key]
    assert only.output_tok_s == pytest.approx(2 * by_count.table[key][1].output_tok_s)


def test_staged_strategies_are_built_for_each_sampler_budget_and_refinement() -> None:
    strategies = replay.default_strategies([10], [4, 8], 4, ["tpe", "gp"])
    staged = {s.name: s for s in strategies if s.strategy == "staged"}
    assert set(staged) == {
        f"staged_{sampler}_{n}{suffix}"
        for sampler in ("tpe", "gp")
        for n in (4, 8)
        for suffix in ("", "_refine_4")
    }
    assert staged["staged_gp_8_refine_4"].sampler == "gp"
    assert staged["staged_gp_8_refine_4"].trials_per_stage == 8
    assert staged["staged_gp_8_refine_4"].refine_trials == 4
    assert staged["staged_tpe_4"].refine_trials == 0
    joint = [s for s in strategies if s.strategy == "joint"]
    assert {s.sampler for s in joint} == {"tpe", "gp", "nsga2", "random"}
    assert not any(s.strategy == "staged" for s in replay.default_strategies([10], [4], 0, []))


def test_each_noise_rule_replays_every_strategy_with_the_settings_given() -> None:
    base = replay.default_strategies([10], [4], 0, ["tpe"])
    out = replay.with_settings(base, ["pooled", "pair"], ["count"], 1, 1)
    assert [s.name for s in out] == [s.name for s in base] + [f"{s.name}_pair" for s in base]
    assert {s.noise for s in out[: len(base)]} == {"pooled"}
    assert {s.noise for s in out[len(base) :]} == {"pair"}
    assert all(s.repeats == 1 and s.baseline_measurements == 1 for s in out)
    assert all(s.count_search_window for s in out)


def test_dropping_the_search_window_replays_every_strategy_again_and_reaches_the_study(
    tmp_path: Path,
) -> None:
    base = replay.default_strategies([10], [4], 0, ["tpe"])
    out = replay.with_settings(base, ["pooled"], ["count", "drop"], 2, 3)
    assert [s.name for s in out] == [s.name for s in base] + [f"{s.name}_drop" for s in base]
    assert [s.count_search_window for s in out] == [True] * len(base) + [False] * len(base)
    config = study_config(base_config(), out[-1], {}, 2.0, 0, tmp_path)
    assert not config.study.count_search_window and config.study.candidate_windows == 2
    config.study.repeats = 0  # then the window is all the winner has, and counts
    assert config.study.keeps_search_window and config.study.candidate_windows == 1


def test_a_switch_to_a_truly_worse_configuration_is_counted() -> None:
    from benchmarks.scoring import worse_switches

    # held a (0.95), took b (0.90: 5 points worse), then c (0.93), then d (0.0: infeasible);
    # the first None -> a is no switch, b -> c is better, c -> c is no switch
    selected = [None, "a", "b", "c", "c", "d"]
    assert worse_switches(selected, [0.0, 0.95, 0.90, 0.93, 0.93, 0.0]) == 2
    # within the target's 3 points: not counted
    assert worse_switches(["a", "b"], [0.95, 0.93]) == 0


def test_acceptance_rules_puts_each_strategys_two_settings_side_by_side() -> None:
    from benchmarks.acceptance_rules import SETTINGS, pairs

    def run(name: str, seed: int, score: float, worse: int, config: str) -> dict[str, object]:
        return {
            "strategy": name,
            "seed": seed,
            "final_score": score,
            "worse_switches": worse,
            "final_config": config,
        }

    line = {
        "reached_97": "1/2",
        "final_feasible": "2/2",
        "median_final_score": 0.9,
        "switched_worse": "0/2",
        "median_launches": 12.0,
    }
    result = {
        "summary": [
            {**line, "strategy": "s"},
            {**line, "strategy": "s_drop"},
            {**line, "strategy": "lone"},
        ],
        "runs": [
            run("s", 0, 1.0, 0, "a"),
            run("s", 1, 0.8, 0, "b"),
            run("s_drop", 0, 1.0, 0, "a"),
            run("s_drop", 1, 0.6, 2, "c"),
        ],
    }
    (row,) = pairs(result, "here", SETTINGS["search_window"])  # "lone" has no counterpart
    assert row["strategy"] == "s" and row["seeds_differing"] == 1
    assert row["worse_switches"] == "0 \\| 2"
    assert row["mean_final_score"] == "0.900 \\| 0.800"
