"""The launches a study plans, those it has done, and the time that remains.

A launch (a server start, its load and its measurement) is what a study's wall time is made of:
a minute or more each on a GPU host, about as long on a CPU. The plan is an upper bound that
tightens as the study learns: a stage ends early when its space is exhausted, a repeated
proposal reuses a measurement, a stage with no winner skips its confirmation. So the plan is
re-drawn at the start of every stage from what is done and what the later stages may still need,
and the estimate of what remains is the mean launch so far times the launches left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tuner.config import StudyConfig
from tuner.server.backend import ServerInfo


@dataclass
class LaunchBudget:
    """Launches done out of the plan, with their wall time."""

    planned: int
    done: int = 0
    launch_s: float = 0.0  # the finished launches' wall time
    started: float = field(default_factory=time.monotonic)
    # What simulated servers' start-ups would have added on real GPUs (wall time, shared
    # between the launches side by side): None while no launch was simulated.
    modelled_extra_s: float | None = None

    def finished(self, seconds: float, modelled_extra_s: float | None = None) -> None:
        self.done += 1
        self.launch_s += seconds
        self.planned = max(self.planned, self.done)
        if modelled_extra_s is not None:
            self.modelled_extra_s = (self.modelled_extra_s or 0.0) + modelled_extra_s

    def wall_line(self) -> str | None:
        """A rehearsal's wall time beside the same study's on the GPUs it simulates."""
        if self.modelled_extra_s is None:
            return None
        gpu = self.elapsed_s + self.modelled_extra_s
        return (
            f"wall time: {duration(self.elapsed_s)} in this rehearsal; the same study on the "
            f"simulated GPUs: ~{duration(gpu)} (their modelled server start-ups, not slept here)"
        )

    def add(self, launches: int) -> None:
        """Launches the plan did not count: a confirmation's rounds past study.repeats."""
        self.planned += max(launches, 0)

    def replan(self, still_needed: int) -> None:
        """What is done plus what the rest of the study may still launch."""
        self.planned = self.done + max(still_needed, 0)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def remaining_s(self) -> float | None:
        """The mean launch so far times the launches left; None before the first one."""
        if self.done == 0:
            return None
        return self.launch_s / self.done * (self.planned - self.done)

    def line(self) -> str:
        eta = self.remaining_s
        left = "time left unknown until a launch ends" if eta is None else f"~{duration(eta)} left"
        return (
            f"progress: {self.done} of at most {self.planned} launches, "
            f"{duration(self.elapsed_s)} elapsed, {left}"
        )


def modelled_extra(server: ServerInfo | None, slots: int) -> float | None:
    """What a simulated server's start-up would add on its GPUs over the one it slept, shared
    between ``slots`` launches side by side; None for a real server."""
    if server is None or server.gpu_startup_s is None:
        return None
    return max(server.gpu_startup_s - server.startup_s, 0.0) / max(slots, 1)


def stage_launches(study: StudyConfig, trials: int) -> int:
    """At most what one stage launches: its trials, then both sides of each confirmation."""
    return trials + 2 * study.repeats


def planned_launches(study: StudyConfig, stage_trials: Sequence[int], baseline: int) -> int:
    """At most what a study launches: ``baseline`` measurements still to take, every stage."""
    return baseline + sum(stage_launches(study, n) for n in stage_trials)


def duration(seconds: float) -> str:
    """``42 s``, ``7 m 05 s``, ``2 h 03 m``: what a person reads at a glance."""
    s = round(max(seconds, 0.0))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


BudgetHook = Callable[[LaunchBudget], None]
