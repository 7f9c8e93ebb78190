"""The stage order chosen from the plan (tuner/study/loop/order.py) and the closed-loop estimate it
plays on (tuner/plan/loaded.py). The estimates are the real estimator's (AIConfigurator,
offline); the plays' logic is also checked on hand-made judges with known answers."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest

from tuner.composition import compose
from tuner.errors import ConfigError
from tuner.plan.loaded import loaded
from tuner.plan.planner import Planner
from tuner.plan.queueing import Load, serve
from tuner.plan.table import PlannedPoint
from tuner.study.loop.order import Judged, Played, _pick, candidate_orders, choose_order, play

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
SELECT = "output_throughput_per_gpu"


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner(compose(["study=llama70b_8xh200"]))


def test_a_closed_loop_queues_the_users_beyond_the_batch(planner: Planner) -> None:
    users = planner.config.workload.concurrency
    small = loaded(planner, {"tensor_parallel_size": 8, "max_num_seqs": users // 4})
    full = loaded(planner, {"tensor_parallel_size": 8, "max_num_seqs": 2 * users})
    assert small is not None and full is not None and small.served and full.served
    assert (small.served.running, full.served.running) == (users // 4, users)
    e = small.planned.estimate
    ttft, tpot = e.ttft_ms / 1000, e.tpot_ms / 1000
    service = ttft + (e.point.osl - 1) * tpot
    # a quarter of the users run: a request waits for up to three whole services before its
    # first token, which the estimator's mean alone never shows
    assert small.served.p99_ttft_s == pytest.approx(ttft + 3 * service)
    assert full.served.p99_ttft_s == pytest.approx(full.planned.estimate.ttft_ms / 1000)
    slo = planner.config.slo
    assert small.planned.meets(slo) and not small.meets(slo)


def test_the_same_queue_as_the_replays_landscapes() -> None:
    served = serve(Load(8, 10, 11), 4, 0.1, 0.01)
    assert served is not None and served.p99_ttft_s == pytest.approx(0.3)


def test_a_point_that_cannot_start_has_no_loaded_estimate(planner: Planner) -> None:
    # bf16 70B on two GPUs at a sliver of their memory: no room for the weights
    params = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.3}
    assert loaded(planner, params) is None


# ---- the plays' logic, on judges with known answers ------------------------------------------
def _judge(table: dict[tuple[int, int], tuple[float, float]]) -> Any:
    """Points (a, b) -> (rank, overshoot); a param left out is 0."""

    def judge(params: dict[str, Any]) -> Judged | None:
        key = (params.get("a", 0), params.get("b", 0))
        if key not in table:
            return None
        rank, over = table[key]
        return Judged(dict(params), rank, over, PlannedPoint({}, None, math.nan))  # type: ignore[arg-type]

    return judge


# a is best at 1 only once b is 1: b first finds (1, 1); a first stays at (0, 0)
TABLE = {(0, 0): (-10.0, 0.0), (1, 0): (-9.0, 0.0), (0, 1): (-11.0, 0.0), (1, 1): (-20.0, 0.0)}
GRIDS = {"a": [{"a": 0}, {"a": 1}], "b": [{"b": 0}, {"b": 1}]}


def test_a_play_moves_a_stage_only_on_a_gain_beyond_min_gain() -> None:
    judge = _judge(TABLE)
    ab = play(("a", "b"), GRIDS, judge, 0.02)
    assert ab.final is not None and ab.final.params == {"b": 1}  # a's stage found no gain
    ba = play(("b", "a"), GRIDS, judge, 0.02)
    assert ba.final is not None and ba.final.params == {"a": 1, "b": 1}
    # at a min_gain above b's 10 %, b's stage keeps the incumbent and a has nothing to find
    assert play(("b", "a"), GRIDS, judge, 0.5).final.params == {}  # type: ignore[union-attr]
    # a group searched again after the other finds the pair
    aba = play(("a", "b", "a"), GRIDS, judge, 0.02)
    assert aba.final is not None and aba.final.params == {"a": 1, "b": 1}


def test_a_play_leaves_an_incumbent_that_misses_for_the_nearest_miss() -> None:
    table = {(0, 0): (-10.0, 0.5), (0, 1): (-5.0, 0.2), (1, 0): (-30.0, 0.9), (1, 1): (-1.0, 0.0)}
    found = play(("b", "a"), GRIDS, _judge(table), 0.02)
    assert found.final is not None and found.final.params == {"a": 1, "b": 1}


def test_the_candidate_orders_keep_an_unmodelled_group_in_its_place() -> None:
    orders = candidate_orders(["q", "p", "runtime", "b", "q"], {"q", "p", "b"})
    assert orders[0] == ("q", "p", "runtime", "b", "q")  # the preset first, as written
    assert len(orders) == len(set(orders))
    assert all(o[2] == "runtime" for o in orders if len(o) >= 4)
    plain = [o for o in orders if len(o) == 4]
    assert len(plain) == 6  # every order of the three modelled groups
    assert ("b", "p", "runtime", "q", "q") not in orders  # never the last group twice in a row
    assert ("b", "p", "runtime", "q", "b") in orders


def _played(order: tuple[str, ...], rank: float, over: float = 0.0) -> Played:
    judged = Judged({}, rank, over, PlannedPoint({}, None, math.nan))  # type: ignore[arg-type]
    return Played(order, judged)


def test_the_preset_stands_unless_an_order_ends_better_beyond_min_gain() -> None:
    preset = _played(("q", "p", "q"), -100.0)
    assert _pick([preset, _played(("p", "q"), -101.0)], 0.02) is preset
    better = _played(("p", "q", "p"), -150.0)
    shorter = _played(("p", "q"), -149.0)
    # beyond the preset, of the orders that end as well as the best, the fewest stages
    assert _pick([preset, better, shorter], 0.02) is shorter
    # an order that meets the SLOs beats one that misses them, whatever its rank
    missing = _played(("q", "p"), -500.0, over=0.1)
    assert _pick([missing, _played(("p", "q"), -10.0)], 0.02).order == ("p", "q")


# ---- the flagship preset, on the real estimator ------------------------------------------------
def test_the_flagship_order_ends_where_the_plan_promises(planner: Planner) -> None:
    choice = choose_order(planner, planner.config, SELECT)
    assert choice is not None and choice.chosen.final is not None
    final, preset = choice.chosen.final, choice.preset.final
    assert final.meets and preset is not None
    assert final.rank <= preset.rank  # never worse than the preset's order on the estimates
    if choice.order != choice.preset.order:  # another order only for a gain beyond min_gain
        assert final.beats(preset, planner.config.study.min_gain)
        assert "chosen from the plan" in choice.line()
    assert ", ".join(choice.order) in choice.line()
    # a smaller FP8 server than the bf16 node, as `tuner plan` ranks it first
    assert final.params.get("quantization") == "fp8"
    assert final.params.get("tensor_parallel_size", 8) < 8


def test_nothing_to_choose_for_a_joint_study(planner: Planner) -> None:
    config = compose(["study=llama70b_8xh200", "study.strategy=joint"])
    assert choose_order(planner, config, SELECT) is None


def test_a_bad_stage_order_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"study\.stage_order must be one of plan, preset"):
        compose(["study=llama70b_8xh200", "study.stage_order=random"])


def test_a_dry_run_runs_the_order_the_plan_chose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    argv = ["run", "study=llama70b_8xh200", "server=simulated_gpu", f"studies_dir={tmp_path}"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr()
    said = next(
        line for line in out.err.splitlines() + out.out.splitlines() if "stage order:" in line
    )
    order = said.split("stage order: ", 1)[1].split(" (", 1)[0].split(", chosen")[0].split(", ")
    stages = [
        line.split(":")[0].removeprefix("stage ")
        for line in out.out.splitlines()
        if line.startswith("stage ")
    ]
    assert [s.rstrip("2") for s in stages] == order  # a group searched again is <group>2
    assert main([*argv, "study.stage_order=preset", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "stage order:" not in out.out + out.err
    stages = [
        line.split(":")[0].removeprefix("stage ")
        for line in out.out.splitlines()
        if line.startswith("stage ")
    ]
    assert stages == ["quantization", "parallelism", "memory", "batching", "quantization2"]
