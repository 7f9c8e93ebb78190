"""The launch budget of `tuner run`: the plan, its ETA, and how it is shown.

On a terminal a rich bar shows launches done out of the plan with an ETA; into a file or pipe the
same facts are plain timestamped lines. Both are checked for real: a pseudo-terminal for the bar,
a StudyRunner over a synthetic table for the lines.
"""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from tuner.config import StudyConfig
from tuner.console import RunDisplay
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.budget import LaunchBudget, duration, planned_launches
from tuner.study.loop.runner import StudyRunner
from tuner.testing.grid_table import DEFAULTS, GROUPS, PARAMS, write_table
from tuner.testing.landscape import Landscape
from tuner.testing.lookup import (
    StudyStrategy,
    base_config,
    categorical_space,
    lookup_trials,
    study_config,
)


def test_the_plan_counts_baseline_stages_and_both_sides_of_each_confirmation() -> None:
    study = StudyConfig(repeats=2)
    assert planned_launches(study, [4, 3], baseline=2) == 2 + (4 + 4) + (3 + 4)


def test_the_estimate_is_the_mean_launch_times_what_is_left() -> None:
    budget = LaunchBudget(planned=5)
    assert budget.remaining_s is None and "unknown" in budget.line()
    budget.finished(60.0)
    budget.finished(120.0)
    assert budget.remaining_s == pytest.approx(90.0 * 3)
    budget.replan(1)  # a stage ended early: done + what may still come
    assert budget.planned == 3 and budget.remaining_s == pytest.approx(90.0)
    assert "2 of at most 3 launches" in budget.line() and "~1 m 30 s left" in budget.line()
    budget.finished(30.0)
    budget.finished(30.0)  # more than planned never reads as negative time
    assert budget.planned == budget.done == 4 and budget.remaining_s == 0.0


@pytest.mark.parametrize(("s", "text"), [(4.4, "4 s"), (425, "7 m 05 s"), (7380, "2 h 03 m")])
def test_durations_read_at_a_glance(s: float, text: str) -> None:
    assert duration(s) == text


def test_a_pipe_gets_timestamped_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    budget = LaunchBudget(planned=3)
    budget.finished(10.0)
    with RunDisplay(out) as display:
        display.say("stage memory: trial 1/2")
        display.launches(budget)
    lines = out.getvalue().splitlines()
    assert all(re.match(r"^\[\d\d:\d\d:\d\d\] ", line) for line in lines)
    assert "1 of at most 3 launches" in lines[1] and "~20 s left" in lines[1]


def test_a_terminal_gets_a_bar_with_launches_and_time_left() -> None:
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        budget = LaunchBudget(planned=5)
        with RunDisplay(tty) as display:
            assert display.live
            budget.finished(60.0)
            budget.finished(60.0)
            display.launches(budget)
            display.say("a line above the bar")
            time.sleep(0.3)  # rich refreshes the bar on its own thread
        shown = _read_all(master)
    assert "launches" in shown and "2/5" in shown and "~3 m 00 s left" in shown
    assert "a line above the bar" in shown


def _read_all(fd: int) -> str:
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def test_a_study_reports_its_budget_after_every_launch(tmp_path: Path) -> None:
    land = Landscape.from_csv(write_table(tmp_path / "grid.csv"), PARAMS, DEFAULTS)
    strategy = StudyStrategy("b", "staged", "random", 2, repeats=1, baseline_measurements=2)
    space = categorical_space(land, GROUPS)
    config = study_config(base_config(), strategy, space, 2.6, 0, tmp_path)
    launches: list[object] = []
    seen: list[tuple[int, int]] = []
    runner = StudyRunner(
        config,
        Evaluator(config),
        {"t": 1},
        lambda _m: None,
        trial_fn=lookup_trials(land, np.random.default_rng(0), launches),
        on_launch=lambda b: seen.append((b.done, b.planned)),
    )
    runner.run()
    assert [done for done, _ in seen] == list(range(1, len(launches) + 1))
    # The plan starts at its upper bound (2 baseline + 2 stages x (2 trials + 2 confirmations))
    # and never promises fewer launches than were made.
    assert seen[0][1] == 2 + 2 * (2 + 2) and all(planned >= done for done, planned in seen)
    assert seen[-1][0] == len(launches)
