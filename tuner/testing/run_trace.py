"""A search run's trace: its launches in order and what it would hand over after each.

A replay (:mod:`tuner.testing.lookup`) fills one per run; the benchmarks score it against the
landscape's truth (benchmarks/scoring.py) and the tests read its launches and decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.study.decision.acceptance import Decision
from tuner.testing.landscape import Key, Landscape, Measured


@dataclass
class Launch:
    label: str  # baseline, <stage>, <stage>-confirm, grid, defaults
    key: Key
    observed: Measured


@dataclass
class RunTrace:
    """Launches in order and the selection after each (None: nothing feasible yet)."""

    strategy: str
    seed: int
    launches: list[Launch] = field(default_factory=list)
    selected: list[Key | None] = field(default_factory=list)
    stopped: str = ""  # why a StudyRunner run ended early (TunerError), if it did
    independent_samples: int = 0  # params a relative sampler drew independently (fell back)
    decisions: list[str] = field(default_factory=list)  # each stage's decision, one line each
    # the constraints the hand-over's windows leave undecided at the study's confidence
    on_edge: list[str] = field(default_factory=list)
    # the study's own word: its hand-over meets every SLO with the confidence asked
    believed_feasible: bool = False

    def explain(self) -> str:
        """What the run launched, what it observed, and what it decided (replay --explain)."""
        lines = [f"{self.strategy} seed {self.seed}:"]
        for launch in self.launches:
            o = launch.observed
            p99 = f"{o.p99_e2e_s:.2f} s" if o.p99_e2e_s is not None else "failed"
            tok_s = f"{o.output_tok_s:.0f} tok/s"
            lines.append(f"  {launch.label:<18} {launch.key}  P99 {p99}, {tok_s}")
        return "\n".join(lines + [f"  {d}" for d in self.decisions])


def incumbent_timeline(
    launches: Sequence[Launch], decisions: Sequence[Decision], land: Landscape
) -> list[Key | None]:
    """After each launch, the incumbent the study would hand over (accepted decisions only)."""
    ends = {}
    for i, launch in enumerate(launches):
        ends[launch.label.removesuffix("-confirm")] = i
    changes = {ends[d.stage]: d for d in decisions if d.stage in ends}
    current: dict[str, Any] = {}
    out: list[Key | None] = []
    for i, _ in enumerate(launches):
        if i in changes and changes[i].accepted:
            current = dict(changes[i].candidate_params)
        out.append(land.key(current))
    return out
