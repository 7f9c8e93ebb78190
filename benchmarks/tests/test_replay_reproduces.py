"""The committed GPU replay results still come out of today's code.

benchmarks/results/search_efficiency/gpu/ holds replays that the README's figures quote. They
were made by ``benchmarks.gpu_replay --landscape llama70b_8xh200 --cv 0.02 0.05 --seeds 20
--slo-levels 25,50,75`` and are not rerun when the tuner changes. A refactor that changes how a
study searches, confirms or scores would leave those files describing code that no longer exists,
without any test failing. Rerunning a whole cell takes ten minutes, so this reruns a slice of one:
the first seed of the staged arm in the preset's stage order and of confirmed random
search, with the landscape, SLO level, noise, seeds and arm settings of the committed run, and
asserts that every per-seed row comes out exactly as replay.json has it (launches, the score and
configuration handed over, whether the study believed it feasible, the launches to 97 %, ...).

Every arm draws its noise from its own seed, independently of which other arms run beside it,
so two arms of two seeds reproduce their rows of the 20-seed run on their own. The rows are
rounded before they are written, so the comparison is exact: any change in what a study
launches or hands over shows up as a different row.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import gpu_replay
from benchmarks.gpu_scoring import edge_flags, handed_worse, percentile_slo
from benchmarks.layout import results
from benchmarks.scoring import aggregate, markdown

# The cell: the 70B preset's landscape with both SLOs at the median of the configurations that
# start, at 5 % noise. Its default staged arm and the plan's order are the same study here, so
# one staged run also checks the plan-ordered arm's rows and the plan's line.
LANDSCAPE, LEVEL, CV = "llama70b_8xh200", 50.0, 0.05
CELL = results("search_efficiency", "gpu", LANDSCAPE, "slo_p50", "cv_0.05")
# The command's defaults that the committed run used: the preset's stage order, 6 trials a
# stage for the staged arms and 24 for the joint ones.
ORDER = ["quantization", "parallelism", "memory", "batching", "quantization"]
STAGED_TRIALS, JOINT_TRIALS = 6, 24
SEEDS = 1  # the first of the committed 20: about 10 s on a 2-core machine
STAGED = "staged_tpe_6_quan-para-memo-batc-quan"
RANDOM = f"joint_random_{JOINT_TRIALS}"
# defaults, grid and random walk come with every seed; the plan arm is the staged one renamed.
STRATEGIES = ["defaults", "grid", "random", STAGED, RANDOM, "staged_tpe_6_plan"]


def as_written(value: Any) -> Any:
    """What run_cell writes to replay.json and reads back: tuples become lists."""
    return json.loads(json.dumps(value, default=str))


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CELL / "replay.json").read_text())
    return data


@pytest.fixture(scope="module")
def rerun() -> dict[str, Any]:
    """The committed run's arms, as main builds them, cut to the two rerun; the landscape's name
    is passed so that replay orders the plan's arm as the committed run did."""
    land = gpu_replay.load(LANDSCAPE).with_noise(CV)
    arms = gpu_replay.strategies(land, [ORDER], STAGED_TRIALS, JOINT_TRIALS)
    by_name = {s.name: (s, groups) for s, groups in arms}
    assert set(by_name) == {STAGED, f"joint_tpe_{JOINT_TRIALS}", RANDOM}
    # The staged arm first: replay takes the first arm as the one the plan reorders.
    chosen = [by_name[STAGED], by_name[RANDOM]]
    result = gpu_replay.replay(land, percentile_slo(land, LEVEL), SEEDS, chosen, None, LANDSCAPE)
    result["reference"]["slo_level"] = LEVEL  # as run_cell adds it
    written: dict[str, Any] = as_written(result)
    return written


def row(runs: list[dict[str, Any]], strategy: str, seed: int) -> dict[str, Any]:
    found = [r for r in runs if r["strategy"] == strategy and r["seed"] == seed]
    assert len(found) == 1, f"{len(found)} rows for {strategy}, seed {seed}"
    return found[0]


def test_the_rerun_sees_the_committed_landscape_slos_and_plan_order(
    rerun: dict[str, Any], committed: dict[str, Any]
) -> None:
    """The SLOs, the best point and its value, the defaults' score, the grid and the plan's
    chosen order: if any of these moved, no per-seed row could be expected to match."""
    assert rerun["reference"] == committed["reference"]


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_rerun_seed_equals_its_committed_row(
    rerun: dict[str, Any], committed: dict[str, Any], strategy: str, seed: int
) -> None:
    assert row(rerun["runs"], strategy, seed) == row(committed["runs"], strategy, seed)


def test_the_rerun_ran_only_the_rows_it_compares(rerun: dict[str, Any]) -> None:
    """No row escapes the comparison above: every rerun row is one of those it checks."""
    pairs = sorted((r["strategy"], r["seed"]) for r in rerun["runs"])
    assert pairs == sorted((s, seed) for s in STRATEGIES for seed in range(SEEDS))


def test_the_committed_landscape_table_is_todays() -> None:
    """landscape.md: every grid point's truth and whether it meets the cell's SLOs."""
    land = gpu_replay.load(LANDSCAPE).with_noise(CV)
    text = markdown(gpu_replay.landscape_rows(land, percentile_slo(land, LEVEL))) + "\n"
    assert text == (CELL / "landscape.md").read_text()


def test_the_committed_summary_is_what_its_committed_rows_add_up_to(
    committed: dict[str, Any],
) -> None:
    """The 20-seed figures the README quotes cannot be rerun here, but they must be what
    today's scoring makes of the committed rows, the rows the tests above tie to today's
    search. The lines are built as replay builds them, and summary.md is their table."""
    rows = committed["runs"]
    summary = aggregate(rows, committed["reference"]["grid_size"])
    for line in summary:
        mine = [r for r in rows if r["strategy"] == line["strategy"]]
        line["worse_than_defaults"] = handed_worse(mine, "worse_than_defaults")
        line["worse_than_defaults_3pct"] = handed_worse(mine, "worse_than_defaults_3pct")
        line["edge_flags"] = edge_flags(mine)
    assert as_written(summary) == committed["summary"]
    table = markdown([{c: line[c] for c in gpu_replay.COLUMNS} for line in summary]) + "\n"
    assert table == (CELL / "summary.md").read_text()


def test_the_cell_is_the_one_the_readme_command_wrote() -> None:
    """A guard on the constants above: the cell lies where main writes this level and noise."""
    assert (CELL / "replay.json").is_file()
    folder = results("search_efficiency", "gpu", LANDSCAPE, gpu_replay.level_folder(LEVEL))
    assert folder / f"cv_{CV:g}" == CELL
