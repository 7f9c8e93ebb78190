"""`tuner compare`'s noise, simulated: each side's spread pooled (what compare does) against
the spread of the pairs of windows (the textbook analysis of a crossover design).

Two endpoints are measured in windows ``A B, B A, A B, ...``. Each window's log throughput is
the machine's state plus the window's own noise, plus the gain when it is B. The machine is
``steady`` (independent windows of 5 %), ``drifting`` (a random walk of 5 % a window plus 3 %)
or ``episodic`` (a neighbour that costs 15 % comes and goes, switching with chance 0.3 before
each window, plus 3 %: one vLLM-CPU server read 2317, 2611, 2816 and 2253 tok/s in four windows
of CI). ``pooled`` is ``tuner.ratio_of``; ``paired`` judges B by the spread
of log(B/A) between pairs, with one degree of freedom fewer than pairs; both by the acceptance
rule at a 2 % min_gain. Each cell: how often the rule calls B different (better or worse) at
gain 0, or better at a real gain. No server: seconds.

    .venv/bin/python -m benchmarks.compare_rule  # → results/acceptance/simulation/compare_rule.md
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.layout import results
from benchmarks.scoring import write_markdown
from tuner import Comparison, NoiseEstimate, Verdict, decide, ratio_of, window_order

OUT = results("acceptance", "simulation", "compare_rule.md")
GAINS = (0.0, 0.10, 0.20)
MIN_GAIN = 0.02
EPISODE_COST, EPISODE_SWITCH = 0.15, 0.3


def steady(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.normal(0, 0.05, n)


def drifting(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.cumsum(rng.normal(0, 0.05, n)) + rng.normal(0, 0.03, n)


def episodic(rng: np.random.Generator, n: int) -> np.ndarray:
    busy, state = bool(rng.integers(0, 2)), []
    for _ in range(n):
        busy ^= bool(rng.random() < EPISODE_SWITCH)
        state.append(-EPISODE_COST if busy else 0.0)
    return np.asarray(state) + rng.normal(0, 0.03, n)


MACHINES: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "steady": steady,
    "drifting": drifting,
    "episodic": episodic,
}


def windows(
    rng: np.random.Generator, pairs: int, gain: float, machine: str
) -> tuple[list[float], list[float]]:
    sides = window_order(pairs)
    logs = np.log(1000.0) + MACHINES[machine](rng, len(sides))
    values = [
        float(np.exp(v + (np.log1p(gain) if s == "B" else 0.0)))
        for v, s in zip(logs, sides, strict=True)
    ]
    a = [v for v, s in zip(values, sides, strict=True) if s == "A"]
    b = [v for v, s in zip(values, sides, strict=True) if s == "B"]
    return a, b


def pooled(a: list[float], b: list[float]) -> str:
    return ratio_of("x", "maximize", a, b, MIN_GAIN).decision


def paired(a: list[float], b: list[float]) -> str:
    """Per measurement, the pairs' SD over the square root of 2: the rule's threshold at n and
    n measurements is then Student's interval of the mean paired difference."""
    diffs = np.log(b) - np.log(a)
    noise = NoiseEstimate(float(np.std(diffs, ddof=1)) / np.sqrt(2), len(diffs) - 1)

    def accepts(inc: list[float], cand: list[float]) -> bool:
        c = Comparison("c", "x", "maximize", inc, cand, True, MIN_GAIN, True, noise)
        return decide(c).accepted

    return Verdict.BETTER if accepts(a, b) else Verdict.WORSE if accepts(b, a) else Verdict.SAME


def rate(rule: Any, pairs: int, gain: float, machine: str, draws: int = 4000) -> float:
    """The share of ``draws`` comparisons the rule calls different (gain 0) or better."""
    rng = np.random.default_rng(11)  # the same draws for both rules
    hits = 0
    for _ in range(draws):
        decision = rule(*windows(rng, pairs, gain, machine))
        hits += decision != Verdict.SAME if gain == 0 else decision == Verdict.BETTER
    return hits / draws


def table() -> list[dict[str, Any]]:
    rows = []
    for machine in MACHINES:
        for pairs in (2, 4):
            row: dict[str, Any] = {"machine": machine, "windows a side": pairs}
            for gain in GAINS:
                cells = [rate(rule, pairs, gain, machine) for rule in (pooled, paired)]
                label = "same server: called different" if gain == 0 else f"B {gain:+.0%}: found"
                row[label] = f"{cells[0]:.3f} \\| {cells[1]:.3f}"
            rows.append(row)
    return rows


def main() -> int:
    text = write_markdown(
        OUT,
        (
            "Each cell: pooled (tuner compare) | paired. steady: independent windows of 5 %; "
            "drifting: a random walk of 5 % a window plus 3 %; episodic: a 15 % slowdown that "
            "switches with chance 0.3 per window, plus 3 %. 4,000 comparisons per cell, seed 11, "
            "min_gain 2 %."
        ),
        table(),
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
