"""The GPU replay (benchmarks/gpu_replay.py) on a small synthetic landscape whose optimum is known.

TP {1, 2} x max_num_seqs {4, 8, 16} for 16 closed-loop users, every point served through the
queueing model. TP 2 has the most tok/s in total, TP 1 the most per GPU, and cap 16 (no wait)
the most of either: the per-GPU optimum is (1, 16), 45 % ahead of the next, so at no noise
every arm that sees it must hand it over. vLLM's defaults here are (2, 4): worse on both knobs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import gpu_replay, gpu_replay_table
from benchmarks.gpu_scoring import (
    edge_flags,
    median_slo,
    off_the_line,
    percentile_slo,
    reference,
    score,
)
from tuner.plan.queueing import Load, serve
from tuner.testing.gpu_landscape import GPU_PARAM, GpuLandscape, GpuSlo, groups_of, measured, point
from tuner.testing.landscape import hypervolume_2d
from tuner.testing.lookup import StudyStrategy, categorical_space, run_study

LOAD = Load(users=16, isl=100, osl=11)
LOOSE = GpuSlo(p99_ttft_s=100.0, p99_tpot_s=100.0)


def synthetic(cv: float = 0.0) -> GpuLandscape:
    truths = {}
    for tp in (1, 2):
        for cap in (4, 8, 16):
            # TP 2 is 1.4x faster per step: more in total, less per GPU.
            served = serve(
                LOAD, min(cap, LOAD.users), 0.1 / 1.4 ** (tp - 1), 0.01 / 1.4 ** (tp - 1)
            )
            truths[(tp, cap)] = measured(served)
    return GpuLandscape([GPU_PARAM, "max_num_seqs"], truths, {GPU_PARAM: 2, "max_num_seqs": 4}, cv)


def test_the_reference_is_the_best_per_gpu_and_tight_slos_cut_it_off() -> None:
    land = synthetic()
    ref = reference(land, LOOSE)
    assert land.params_of(ref.best_key) == {GPU_PARAM: 1, "max_num_seqs": 16}
    assert ref.feasible_share == 1.0
    assert land.per_gpu((2, 16)) < ref.best_value < land.true((2, 16)).output_tok_s
    assert 0 < ref.defaults_score < 0.5
    # TTFT at cap 4 includes 3 rounds of waiting: an SLO of 0.45 s leaves only the caps above.
    tight = reference(land, GpuSlo(p99_ttft_s=0.45, p99_tpot_s=100.0))
    assert tight.defaults_score == 0.0 and score(land, tight, (1, 4)) == 0.0


def test_the_median_slo_puts_no_configuration_on_the_line_and_keeps_who_meets_it() -> None:
    # Five values, the median (3) is one of them: the SLO moves half-way to the next (4).
    assert off_the_line([5.0, 1.0, 3.0, 4.0, 2.0]) == pytest.approx(3.5)
    # A tied middle: 2 and 2 of six values; half-way to 6.
    assert off_the_line([1.0, 2.0, 2.0, 2.0, 6.0, 7.0]) == pytest.approx(4.0)
    # An even count with distinct middles: numpy's median already lies between them.
    assert off_the_line([1.0, 2.0, 4.0, 8.0]) == pytest.approx(3.0)
    land = synthetic()
    slo = median_slo(land)
    truths = [land.true(k) for k in land.grid_keys()]
    for values, line in (
        ([m.p99_ttft_s for m in truths], slo.p99_ttft_s),
        ([m.p99_tpot_s for m in truths], slo.p99_tpot_s),
    ):
        assert not np.any(np.isclose(values, line, rtol=1e-9, atol=0.0))
        # The same configurations meet it as meet the plain median.
        assert [v <= line for v in values] == [v <= float(np.median(values)) for v in values]


def test_noise_is_multiplicative_at_the_stated_cv_and_absent_at_zero() -> None:
    truth = synthetic().true((1, 16))
    rng = np.random.default_rng(0)
    assert synthetic(0.0).draw((1, 16), rng) == truth
    draws = [synthetic(0.05).draw((1, 16), rng) for _ in range(4000)]
    tok = np.array([d.output_tok_s for d in draws]) / truth.output_tok_s
    tpot = np.array([d.p99_tpot_s for d in draws]) / truth.p99_tpot_s
    assert tok.mean() == pytest.approx(1.0, abs=0.005) and tok.std() == pytest.approx(0.05, rel=0.1)
    assert tpot.std() == pytest.approx(0.05, rel=0.1)
    assert abs(np.corrcoef(tok, tpot)[0, 1]) < 0.1  # independent factors


def test_every_arm_finds_the_known_optimum_at_no_noise() -> None:
    land = synthetic()
    arms = [
        (
            StudyStrategy("staged", "staged", "tpe", 3, repeats=1),
            groups_of(land, ["parallelism", "batching"]),
        ),
        (
            StudyStrategy("joint", "joint", "tpe", 6, repeats=1),
            {"joint": [GPU_PARAM, "max_num_seqs"]},
        ),
    ]
    result = gpu_replay.replay(land, LOOSE, 1, arms)
    assert result["reference"]["grid_size"] == 6
    assert result["reference"]["defaults"] == {GPU_PARAM: 2, "max_num_seqs": 4}
    rows = result["runs"]
    assert {r["strategy"] for r in rows} == {"defaults", "grid", "random", "staged", "joint"}
    for r in rows:
        best = result["reference"]["defaults_score"] if r["strategy"] == "defaults" else 1.0
        assert r["final_score"] == pytest.approx(best, abs=1e-4)
        assert not r["worse_than_defaults"]
        assert all(0.0 <= r[f"hv_at_{t}"] <= 1.0 + 1e-9 for t in (5, 10, 20))
    grid = [r for r in rows if r["strategy"] == "grid"]
    # The nested walk reaches (1, 16) third, and the whole grid spans the whole hypervolume.
    assert all(r["trials_to_97"] == 3 and r["hv_at_20"] == 1.0 for r in grid)
    staged = [r for r in rows if r["strategy"] == "staged"]
    assert all(r["baseline_launches"] == 3 for r in staged)
    # The per-GPU objective reached the study: tok/s in total would have picked TP 2.
    assert all(r["final_config"] == {GPU_PARAM: 1, "max_num_seqs": 16} for r in staged)


def test_a_near_miss_leads_the_next_stage_to_an_optimum_that_needs_both_knobs() -> None:
    """TP 1 at 16 sequences serves 80 % more per GPU than vLLM's defaults (TP 2, 16) but its
    TTFT is 10 % over the SLO until its cap drops to 4 (1.5x the defaults, feasible). The
    parallelism stage alone cannot accept TP 1, the batching stage at TP 2 finds nothing better:
    only a stage run around the near miss reaches (1, 4). At no noise it must, and it must not
    hand over the near miss itself."""
    slo = GpuSlo(p99_ttft_s=1.0, p99_tpot_s=100.0)
    truths = {
        (1, 16): point(180, 1, 1.1),
        (1, 4): point(150, 1, 0.5),
        (2, 16): point(100, 2, 0.6),
        (2, 4): point(90, 2, 0.4),
    }
    land = GpuLandscape([GPU_PARAM, "max_num_seqs"], truths, {GPU_PARAM: 2, "max_num_seqs": 16})
    groups = groups_of(land, ["parallelism", "batching"])
    arms = [(StudyStrategy("staged", "staged", "tpe", 2, repeats=1), groups)]
    result = gpu_replay.replay(land, slo, 2, arms)
    staged = [r for r in result["runs"] if r["strategy"] == "staged"]
    assert result["reference"]["defaults_score"] == pytest.approx(100 / 150)
    assert all(r["final_config"] == {GPU_PARAM: 1, "max_num_seqs": 4} for r in staged)
    assert all(r["final_score"] == pytest.approx(1.0) for r in staged)


def test_edge_flags_count_what_the_study_called_feasible_by_its_truth() -> None:
    def row(believed: bool, score: float, on_edge: list[str]) -> dict[str, object]:
        return {"believed_feasible": believed, "final_score": score, "on_edge": on_edge}

    rows = [
        row(True, 0.0, ["slo_p99_tpot"]),  # truly over the SLO, and flagged
        row(True, 0.0, []),  # truly over, read well under: missed
        row(True, 0.98, []),
        row(True, 1.0, ["slo_p99_ttft"]),  # truly met, within the noise of the SLO
        row(False, 0.0, []),  # printed NOT FEASIBLE: no hand-over to flag
    ]
    assert edge_flags(rows) == "1/2 infeasible, 1/2 feasible"
    assert edge_flags([row(False, 0.0, [])]) == "-"
    # At no noise no window spreads: nothing is on an edge, in any arm of a replay.
    result = gpu_replay.replay(
        synthetic(),
        LOOSE,
        1,
        [
            (
                StudyStrategy("staged", "staged", "tpe", 3, repeats=1),
                groups_of(synthetic(), ["parallelism", "batching"]),
            ),
        ],
    )
    staged = [r for r in result["runs"] if r["strategy"] == "staged"]
    assert staged and all(r["believed_feasible"] and r["on_edge"] == [] for r in staged)


def test_the_hypervolume_of_a_staircase_is_its_area_worked_by_hand() -> None:
    """Three points on a staircase up to (4, 4): strips of 3x1, 2x1 and 1x1. A dominated
    point, a duplicate and a point beyond the reference add nothing."""
    stairs = [(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)]
    assert hypervolume_2d(stairs, (4.0, 4.0)) == 6.0
    assert hypervolume_2d([*stairs, (3.0, 3.0), (2.0, 2.0), (5.0, 0.5)], (4.0, 4.0)) == 6.0
    assert hypervolume_2d([], (4.0, 4.0)) == 0.0


def crossed() -> GpuLandscape:
    """Five configurations that start (P99 TTFT 0.1 .. 1.6 s, P99 TPOT 10 .. 90 ms) and a failed
    start. The fastest TTFT (0.1 s) has the second TPOT (20 ms), the fastest TPOT the second
    TTFT (0.2 s): below the 25th percentile of both no configuration meets both SLOs."""
    ttft = [0.4, 0.1, 1.6, 0.2, 0.8]
    tpot = [0.05, 0.02, 0.09, 0.01, 0.03]
    keys = [(tp, cap) for tp in (1, 2) for cap in (4, 8, 16)]
    truths = {
        k: dataclasses.replace(point(100, k[0], t), p99_tpot_s=p)
        for k, t, p in zip(keys, ttft, tpot, strict=False)
    }
    truths[keys[-1]] = measured(None)
    return GpuLandscape([GPU_PARAM, "max_num_seqs"], truths, {GPU_PARAM: 1, "max_num_seqs": 4})


def test_an_slo_level_is_that_percentile_of_the_p99s_of_what_starts() -> None:
    """numpy's linear percentile of five values falls on a value at 25, 50 and 75 (index 1, 2,
    3), which then moves half-way to the next; at 10 and 90 it falls between two and stays.
    The failed start counts in neither."""
    land = crossed()
    for level, want_ttft, want_tpot in (
        (10, 0.14, 0.014),  # 0.1 + 0.4 x 0.1; 0.01 + 0.4 x 0.01: between values, as numpy has it
        (25, 0.3, 0.025),  # on 0.2 and 0.02: half-way to 0.4 and 0.03
        (50, 0.6, 0.04),  # on 0.4 and 0.03: half-way to 0.8 and 0.05
        (75, 1.2, 0.07),  # on 0.8 and 0.05: half-way to 1.6 and 0.09
        (90, 1.28, 0.074),  # 0.8 + 0.6 x 0.8; 0.05 + 0.6 x 0.04
    ):
        slo = percentile_slo(land, level)
        assert slo.p99_ttft_s == pytest.approx(want_ttft)
        assert slo.p99_tpot_s == pytest.approx(want_tpot)
    assert percentile_slo(land, 50) == median_slo(land)
    # The levels order the question: more of the landscape meets a higher one.
    shares = [reference(land, percentile_slo(land, q)).feasible_share for q in (25, 50, 75, 90)]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_confirmed_random_search_runs_through_the_study_runner_with_its_confirmations() -> None:
    land = synthetic(cv=0.05)
    arms = gpu_replay.strategies(land, [["parallelism", "batching"]], 2, 6)
    by_name = {s.name: (s, groups) for s, groups in arms}
    tpe, _ = by_name["joint_tpe_6"]
    rand, groups = by_name["joint_random_6"]
    # A peer of joint TPE: the same strategy, budget, repeats and space, only the sampler differs.
    assert (rand.strategy, rand.sampler, rand.n_startup_trials) == ("joint", "random", 0)
    assert (rand.trials_per_stage, rand.repeats) == (tpe.trials_per_stage, tpe.repeats)
    assert groups == {"joint": [GPU_PARAM, "max_num_seqs"]}
    trace = run_study(
        land, gpu_replay.gpu_config(land, LOOSE), rand, categorical_space(land, groups), 0.0, 3
    )
    labels = [launch.label for launch in trace.launches]
    assert labels[:3] == ["baseline"] * 3 and "joint" in labels
    assert labels.count("joint-confirm") >= 2 * rand.repeats  # candidate and incumbent, repeated
    # A decision stored by StudyRunner's acceptance rule: what an unconfirmed walk never has.
    assert len(trace.decisions) == 1 and trace.decisions[0].startswith("stage joint:")
    result = gpu_replay.replay(land, LOOSE, 1, [by_name["joint_random_6"]])
    (row,) = [r for r in result["runs"] if r["strategy"] == "joint_random_6"]
    assert row["launches"] == len(labels) and row["baseline_launches"] == 3
    assert set(result["seconds_per_seed"]) == {gpu_replay.WALKS, "joint_random_6"}


def test_slo_levels_write_one_folder_each_and_the_table_gathers_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_replay, "load", lambda _name: synthetic())
    small = ["--seeds", "1", "--staged-trials", "1", "--joint-trials", "2"]
    small += ["--orders", "parallelism,batching", "--cv", "0", "--landscape", "llama8b_h100"]
    out = tmp_path / "llama8b_h100"
    assert gpu_replay.main([*small, "--slo-levels", "25,90", "--out", str(out)]) == 0
    for level in (25, 90):
        data = json.loads((out / f"slo_p{level}" / "cv_0" / "replay.json").read_text())
        slo = percentile_slo(synthetic(), level)
        assert data["reference"]["slo_level"] == level
        assert data["reference"]["slo"] == dataclasses.asdict(slo)
    assert not (out / "cv_0").exists()
    # Without the option: the median, in the layout before the levels.
    assert gpu_replay.main([*small, "--out", str(tmp_path / "median")]) == 0
    data = json.loads((tmp_path / "median" / "cv_0" / "replay.json").read_text())
    assert data["reference"]["slo"] == dataclasses.asdict(median_slo(synthetic()))
    with pytest.raises(SystemExit):  # a level sets both SLOs: a given one would be ignored
        gpu_replay.main([*small, "--slo-levels", "25", "--slo-ttft", "1", "--out", str(tmp_path)])
    # A level that leaves nothing meeting both SLOs is refused before any level runs, naming
    # the lowest that leaves some (crossed(): 24 leaves none, 25 the fastest TTFT).
    monkeypatch.setattr(gpu_replay, "load", lambda _name: crossed())
    with pytest.raises(SystemExit, match=r"levels \[10\.0, 24\.0\].*meets: 25$"):
        gpu_replay.main([*small, "--slo-levels", "50,10,24", "--out", str(tmp_path / "low")])
    assert not (tmp_path / "low").exists()
    cells = gpu_replay_table.gather(tmp_path)
    assert [(c.landscape, c.level, c.cv) for c in cells] == [
        ("llama8b_h100", 25.0, 0.0),
        ("llama8b_h100", 90.0, 0.0),
    ]
    assert "joint_random_2" in gpu_replay_table.strategies_of(cells)


def summary_line(
    strategy: str, reached: str, launches: float, feasible: str, worse: str
) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "reached_97": reached,
        "median_launches": launches,
        "final_feasible": feasible,
        "worse_than_defaults": worse,
    }


def write_replay(folder: Path, cv: float, lines: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True)
    data = {"reference": {"cv": cv, "grid_size": 480}, "summary": lines, "runs": []}
    (folder / "replay.json").write_text(json.dumps(data))


def test_the_table_says_by_how_much_a_cell_misses_the_bar(tmp_path: Path) -> None:
    """Grid of 480: 24 launches is the bar's 5 %, 33.6 is 7 %."""
    passing = summary_line("joint_tpe_24", "19/20", 24, "20/20", "0/20")
    missing = summary_line("joint_random_24", "16/20", 33.6, "19/20", "2/20")
    write_replay(tmp_path / "llama8b_h100" / "slo_p25" / "cv_0.05", 0.05, [passing, missing])
    write_replay(tmp_path / "llama8b_h100" / "cv_0.05", 0.05, [passing])  # before the levels
    cells = gpu_replay_table.gather(tmp_path)
    assert len(cells) == 1  # the folder without a level only with everything=True
    text = gpu_replay_table.table(cells)
    header, _, row = text.splitlines()
    assert header.split(" | ")[3:] == ["joint_tpe_24", "joint_random_24 |"]
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[:3] == ["llama8b_h100 (est.)", "p25", "0.05"]
    assert cols[3] == "19/20 · 5.0 % · 0/20 · 0/20 ok"
    assert cols[4] == (
        "16/20 · 7.0 % · 1/20 · 2/20 **misses** "
        "reach -3, launches +2.0 pts, infeasible +1, worse +2"
    )
    cells = gpu_replay_table.gather(tmp_path, everything=True)
    assert [gpu_replay_table.level_text(c) for c in cells] == ["p25", "median (p50)"]
    # A strategy the older replay did not run reads "-", not a miss.
    assert gpu_replay_table.table(cells).splitlines()[3].endswith(" ok | - |")
    # Of fewer seeds the reach bar is as many in share: 2 of 2.
    assert gpu_replay_table.shortfalls(gpu_replay_table.Verdict(1, 2, 1.0, 0, 0)) == ["reach -1"]
