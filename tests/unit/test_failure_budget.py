"""The failure budget's two rules, and the reason it names (the real study path: tests/faults)."""

from __future__ import annotations

import pytest

from tuner.config import StudyConfig
from tuner.errors import StudyFailedError
from tuner.study.loop.failure_budget import FailureBudget


def test_consecutive_failures_stop_and_a_success_resets_the_run() -> None:
    budget = FailureBudget(StudyConfig(max_consecutive_failures=3, max_failure_rate=1.0))
    for ok, reason in [(False, "oom"), (False, "oom"), (True, ""), (False, "oom")]:
        budget.count(ok, reason)  # never 3 in a row
    budget.count(False, "crash")
    with pytest.raises(StudyFailedError, match=r"5 trials failed, most often oom \(3x\)"):
        budget.count(False, "crash")


def test_failure_rate_counts_only_from_three_failures() -> None:
    budget = FailureBudget(StudyConfig(max_consecutive_failures=99, max_failure_rate=0.5))
    budget.count(False, "oom")
    budget.count(False, "oom")  # 2 of 2 failed, but fewer than 3 failures: go on
    for _ in range(3):
        budget.count(True, "")
    budget.count(False, "invalid_argument")  # 3 of 6: not above 0.5
    with pytest.raises(StudyFailedError) as err:
        budget.count(False, "invalid_argument")  # 4 of 7
    assert "most often" in err.value.one_line() and "can be resumed" in err.value.one_line()
