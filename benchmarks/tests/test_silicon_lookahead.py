"""study.prescreen's one-stage look-ahead on a silicon table (benchmarks/silicon.py), replayed
as benchmarks/gpu_replay.py replays it; tests/unit/test_plan_lookahead.py holds the rest."""

from __future__ import annotations

import logging

from benchmarks import gpu_replay, silicon
from benchmarks.gpu_scoring import median_slo
from tuner.testing.gpu_landscape import GpuSlo, gpu_config
from tuner.testing.lookup import categorical_space, run_study

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)


def test_a_lead_the_estimator_named_hands_over_a_point_that_met_the_slos() -> None:
    """The silicon 70B H200 1k/1k table at 2 % noise, seed 6, 4 trials a stage: TP 4 leads the
    batching stage from the estimates; there 32 sequences (truly 1 % over the TTFT SLO) reads
    under it on its window and wins, and fails its repeats with the stage's budget spent. The
    incumbent (TP 8 at 64) misses the SLOs too: the feasibility step would hand over the
    nearer miss, 32 sequences. The 16 sequences that met the SLOs are confirmed instead."""
    name = "llama70b_h200_1k1k"
    land = gpu_replay.load(name).with_noise(0.02)
    median = median_slo(land)
    slo = GpuSlo(median.p99_ttft_s, median.p99_tpot_s)
    config = gpu_config(land, slo)
    gpu_replay.estimated_on(config, silicon.TABLES[name], land)
    ((strategy, groups),) = [
        a
        for a in gpu_replay.strategies(land, [["parallelism", "batching"]], 4, 8, 0, True)
        if a[0].prescreen
    ]
    trace = run_study(land, config, strategy, categorical_space(land, groups), 0.0, seed=6)
    confirmed = [launch.key for launch in trace.launches if launch.label.endswith("confirm")]
    assert (4, 32) in confirmed and (4, 16) in confirmed  # the winner's repeats, then 16's
    assert not slo.met(land.true((4, 32))) and slo.met(land.true((4, 16)))
    assert trace.selected[-1] == (4, 16)
