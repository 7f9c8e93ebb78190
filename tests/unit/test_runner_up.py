"""A stage whose winner read just under an SLO once confirms the next trial that met it.

Replayed through the real StudyRunner on a one-knob GPU landscape (tuner.testing.gpu_landscape,
the harness of benchmarks/gpu_replay.py): TP 4 serves the most per GPU but is truly 5 % over
the TTFT SLO, and its first window reads 1 % under it; TP 8 meets the SLO with room; vLLM's
default, TP 1, misses it by far.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tuner.testing.gpu_landscape import (
    GPU_PARAM,
    GpuLandscape,
    GpuSlo,
    gpu_config,
    groups_of,
    point,
)
from tuner.testing.landscape import Key, Measured
from tuner.testing.lookup import StudyStrategy, categorical_space, run_study

SLO = GpuSlo(p99_ttft_s=1.0, p99_tpot_s=100.0)
LUCKY = (4,)


class LuckyOnce(GpuLandscape):
    """TP 4's first window reads under the SLO; every later one reads its truth."""

    def __init__(self, truths: dict[Key, Measured] | None = None, caps: bool = False) -> None:
        truths = truths or {
            (1,): point(130, 1, 3.0),
            (2,): point(120, 2, 2.0),
            (4,): point(160, 4, 1.05),
            (8,): point(100, 8, 0.5),
        }
        params = [GPU_PARAM, "max_num_seqs"] if caps else [GPU_PARAM]
        defaults = {GPU_PARAM: 1, "max_num_seqs": 16} if caps else {GPU_PARAM: 1}
        super().__init__(params, truths, defaults)
        self.lucky = (4, 16) if caps else LUCKY
        self.drawn = 0

    def draw(self, key: Key, rng: np.random.Generator) -> Measured:
        m = super().draw(key, rng)
        if key == self.lucky:
            self.drawn += 1
            if self.drawn == 1:
                return replace(m, p50_ttft_s=0.99, p99_ttft_s=0.99)
        return m


@pytest.mark.parametrize(("trials", "handed_over"), [(4, 8), (3, 4)])
def test_a_winner_that_fails_its_repeats_gives_way_to_one_that_met_the_slos(
    trials: int, handed_over: int
) -> None:
    """4 trials over 4 TPs leave one launch after the search: TP 8 is confirmed and handed
    over. With 3 the stage has nothing left to pay for it, and the feasibility step keeps the
    nearest miss, TP 4 (its repeats 5 % over, TP 1's 200 %)."""
    land = LuckyOnce()
    groups = groups_of(land, ["parallelism"])
    strategy = StudyStrategy("staged", "staged", "tpe", trials, repeats=1)
    config = gpu_config(land, SLO)
    trace = run_study(land, config, strategy, categorical_space(land, groups), 0.0, seed=0)
    assert land.drawn >= 2  # TP 4 was searched, then re-measured
    assert trace.selected[-1] == (handed_over,)
    confirmed = [launch.key for launch in trace.launches if launch.label.endswith("confirm")]
    assert ((8,) in confirmed) == (handed_over == 8)


def test_the_passed_over_winner_leads_the_next_stage_to_the_optimum() -> None:
    """As above, then a batching stage: TP 4 meets the SLO with room at 8 sequences and serves
    50 % more per GPU than TP 8 there. The passed-over TP 4 (5 % over on its repeats) leads the
    batching stage, which finds (4, 8) and confirms it against TP 8."""
    truths = {}
    for tp, per_gpu, ttft in ((1, 130, 3.0), (2, 120, 2.0), (4, 160, 1.05), (8, 100, 0.5)):
        truths[(tp, 16)] = point(per_gpu, tp, ttft)
        truths[(tp, 8)] = point(per_gpu * 0.94, tp, ttft * 2 / 3)
    land = LuckyOnce(truths, caps=True)
    groups = groups_of(land, ["parallelism", "batching"])
    strategy = StudyStrategy("staged", "staged", "tpe", 4, repeats=1)
    config = gpu_config(land, SLO)
    config.server.args["max_num_seqs"] = 16  # the default as a point of the batching space
    trace = run_study(land, config, strategy, categorical_space(land, groups), 0.0, seed=0)
    assert (8, 16) in trace.selected  # the runner-up was handed the incumbency first
    assert trace.selected[-1] == (4, 8)
