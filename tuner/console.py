"""What `tuner run` shows while it works: timestamped lines, and the launch budget with an ETA.

On a terminal, a rich progress bar stays at the bottom (launches done out of the study's plan,
elapsed time, time left) while the lines scroll above it. Into a file or a pipe (CI logs, nohup),
a bar would be noise, so the budget is one more timestamped line after each launch.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from tuner.study.loop.budget import LaunchBudget, duration


def stamp(message: str) -> str:
    return f"[{time.strftime('%H:%M:%S')}] {message}"


def say(message: str) -> None:
    """One timestamped line on stderr: the commands' progress where no RunDisplay runs."""
    print(stamp(message), file=sys.stderr, flush=True)


class RunDisplay:
    """A context manager; :meth:`say` and :meth:`launches` are the study runner's hooks."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> RunDisplay:
        if self.live:
            console = Console(file=self.stream)
            self._bar = Progress(
                TextColumn("launches"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[elapsed]} elapsed, {task.fields[left]}"),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task("launches", total=None, elapsed="0 s", left="")
            self._bar.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def say(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(stamp(message), markup=False, highlight=False)
        else:
            print(stamp(message), file=self.stream, flush=True)

    def launches(self, budget: LaunchBudget) -> None:
        if self._bar is None or self._task is None:
            self.say(budget.line())
            return
        eta = budget.remaining_s
        self._bar.update(
            self._task,
            total=budget.planned,
            completed=budget.done,
            elapsed=duration(budget.elapsed_s),
            left="time left unknown" if eta is None else f"~{duration(eta)} left",
        )
