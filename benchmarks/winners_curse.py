"""The winner's curse, simulated: how often a stage hands over its winner, with and without
the winner's search window among the winner's measurements (``study.count_search_window``).

A stage measures ``k`` configurations once each (the search); the best window wins. Each of
them is truly ``gain`` better than the incumbent, with log-normal noise of ``cv`` in every
window. The incumbent has ``baselines`` windows plus ``repeats`` interleaved re-measurements,
the winner its ``repeats`` fresh windows and, when counted, its search window: the maximum of
``k`` draws, which reads high. :func:`tuner.decide` judges them with the pooled rule at
tuner's default ``min_gain`` of 3 %. No server, no table: seconds.

    .venv/bin/python -m benchmarks.winners_curse  # → results/acceptance/simulation/winners_curse.md
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from benchmarks.layout import results
from benchmarks.scoring import write_markdown
from tuner import Comparison, NoiseEstimate, decide

OUT = results("acceptance", "simulation", "winners_curse.md")
BUDGETS = {"default": (3, 2), "quickstart": (2, 1)}  # (baseline windows, repeats)
GAINS = (-0.05, 0.0, 0.10, 0.20)
CVS = (0.05, 0.10)


def accept_rate(
    gain: float,
    cv: float,
    baselines: int,
    repeats: int,
    count_window: bool,
    k: int = 4,
    draws: int = 3000,
    seed: int = 7,
) -> float:
    """The share of ``draws`` stages that hand over the winner (same seed: the same draws for
    both settings of ``count_window``)."""
    rng = np.random.default_rng(seed)
    accepted = 0
    for _ in range(draws):
        inc = list(1000.0 * np.exp(rng.normal(0, cv, baselines + repeats)))
        window = float(1000.0 * (1 + gain) * np.exp(rng.normal(0, cv, k)).max())
        fresh = list(1000.0 * (1 + gain) * np.exp(rng.normal(0, cv, repeats)))
        cand = [window] * count_window + fresh
        d = decide(
            Comparison(
                "s", "tok_s", "maximize", inc, cand, True, 0.03, pooled=NoiseEstimate.of(inc, cand)
            )
        )
        accepted += d.accepted
    return accepted / draws


def table() -> list[dict[str, Any]]:
    rows = []
    for budget, (baselines, repeats) in BUDGETS.items():
        for cv in CVS:
            row: dict[str, Any] = {"budget": budget, "cv": cv}
            for gain in GAINS:
                rates = [accept_rate(gain, cv, baselines, repeats, c) for c in (True, False)]
                row[f"gain {gain:+.0%}"] = f"{rates[0]:.3f} \\| {rates[1]:.3f}"
            rows.append(row)
    return rows


def main() -> int:
    text = write_markdown(
        OUT,
        (
            "Share of stages that hand over a winner truly `gain` better than the incumbent; each "
            "cell: count | drop (study.count_search_window), 4 configurations searched, 3,000 "
            "stages, seed 7."
        ),
        table(),
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
