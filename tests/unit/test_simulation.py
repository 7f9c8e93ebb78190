"""The simulated GPU host's continuous batching (tuner.simulation.engine), on a physics table
made by hand: the running batch is capped by max_num_seqs, the token budget and the KV cache,
and what does not fit waits."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tuner.server.simulated import noise_cv, stamp
from tuner.simulation import fake_nvml
from tuner.simulation.engine import Engine, Sequence
from tuner.simulation.launch_noise import launch_factor, valid_cv
from tuner.simulation.physics import Launch, Physics, batch_grid


def physics(max_num_seqs: int = 4, budget: int = 8192, kv_tokens: int = 100_000) -> Physics:
    launch = Launch(model="m", max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    # a decode step of 10 ms at batch 1 growing to 20 ms at 4; prefill 1 ms per 1024 tokens
    return Physics("h100_sxm", launch, kv_tokens, 10.0, 0.0, 0.001 / 1024, (1, 4), (0.01, 0.02))


def run(engine: Engine, until_idle: int = 10_000) -> dict[int, list[float]]:
    """Token times of every sequence, stepping the engine on its own clock."""
    now, times = 0.0, dict[int, list[float]]()
    for _ in range(until_idle):
        if engine.idle:
            break
        step = engine.step(now)
        now += step.duration_s
        for seq in step.tokens:
            times.setdefault(seq.rid, []).append(now)
    return times


def test_the_running_batch_is_capped_by_max_num_seqs_and_the_rest_waits() -> None:
    engine = Engine(physics(max_num_seqs=4))
    for rid in range(6):
        engine.add(Sequence(rid, prompt_tokens=100, max_tokens=5, arrived_at=0.0))
    first = engine.step(0.0)
    assert len(engine.running) == 4 and len(engine.waiting) == 2
    assert [s.rid for s in first.admitted] == [0, 1, 2, 3]
    times = run(engine)
    assert all(len(times[rid]) == 4 for rid in range(4))  # the first came with the first step
    assert all(len(times[rid]) == 5 for rid in (4, 5))
    # the two that queued get their first token only after a running sequence finished
    assert min(times[4][0], times[5][0]) > max(times[r][-1] for r in range(4)) - 1e-9


def test_the_token_budget_chunks_a_long_prompt_over_several_steps() -> None:
    engine = Engine(physics(budget=512))
    engine.add(Sequence(0, prompt_tokens=2000, max_tokens=2, arrived_at=0.0))
    steps = [engine.step(0.0) for _ in range(4)]
    assert [s.prefill_tokens for s in steps] == [512, 512, 512, 464]
    assert [len(s.tokens) for s in steps] == [0, 0, 0, 1]  # the first token after the prefill


def test_decodes_take_budget_before_prefills() -> None:
    engine = Engine(physics(budget=100))
    engine.add(Sequence(0, prompt_tokens=10, max_tokens=50, arrived_at=0.0))
    engine.step(0.0)  # prefilled, first token
    for rid in (1, 2):
        engine.add(Sequence(rid, prompt_tokens=500, max_tokens=2, arrived_at=0.0))
    step = engine.step(0.0)
    assert step.prefill_tokens == 99  # one of the budget's 100 tokens went to the decode


def test_a_request_waits_for_kv_cache_it_does_not_find() -> None:
    engine = Engine(physics(max_num_seqs=8, kv_tokens=1000))
    for rid in range(3):
        engine.add(Sequence(rid, prompt_tokens=300, max_tokens=100, arrived_at=0.0))
    engine.step(0.0)
    assert len(engine.running) == 2 and len(engine.waiting) == 1  # 800 of 1000 in use
    assert engine.kv_usage == pytest.approx(0.8)
    run(engine)
    assert engine.kv_used == 0


def test_queueing_lengthens_the_time_to_first_token() -> None:
    alone = Engine(physics(max_num_seqs=2))
    alone.add(Sequence(0, 100, 20, 0.0))
    crowded = Engine(physics(max_num_seqs=2))
    for rid in range(5):
        crowded.add(Sequence(rid, 100, 20, 0.0))
    assert run(crowded)[4][0] > 2 * run(alone)[0][0]


def test_an_aborted_request_frees_its_place_and_its_cache() -> None:
    engine = Engine(physics(max_num_seqs=1))
    gone, next_one = Sequence(0, 100, 50, 0.0), Sequence(1, 100, 5, 0.0)
    engine.add(gone)
    engine.add(next_one)
    engine.step(0.0)
    engine.abort(gone)
    assert engine.kv_used == 0
    engine.step(0.0)
    assert engine.running == [next_one]


def test_the_table_grid_covers_max_num_seqs() -> None:
    assert batch_grid(48) == (1, 2, 4, 8, 16, 32, 48)
    assert batch_grid(1) == (1,)


def test_simulated_devices_are_busy_only_while_their_server_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(fake_nvml.STATE_ENV, str(tmp_path))
    monkeypatch.setenv(fake_nvml.SYSTEM_ENV, "h200_sxm")
    fake_nvml.write_state(3, 80.0, 1000.0, os.getpid())
    assert fake_nvml.nvmlDeviceGetUtilizationRates(3).gpu == 80
    assert fake_nvml.nvmlDeviceGetUtilizationRates(2).gpu == 0
    assert "H200" in fake_nvml.nvmlDeviceGetName(3) and "simulated" in fake_nvml.nvmlDeviceGetName(
        3
    )
    fake_nvml.write_state(4, 80.0, 1000.0, 2**22 + 12345)  # a pid that cannot be alive
    assert fake_nvml.nvmlDeviceGetUtilizationRates(4).gpu == 0
    first = fake_nvml.nvmlDeviceGetTotalEnergyConsumption(3)
    assert fake_nvml.nvmlDeviceGetTotalEnergyConsumption(3) >= first
    fake_nvml.clear_state(3, os.getpid())
    assert fake_nvml.nvmlDeviceGetUtilizationRates(3).gpu == 0
    with pytest.raises(fake_nvml.NVMLError):
        fake_nvml.nvmlDeviceGetHandleByIndex(8)


def test_a_prefill_costs_its_tokens_whatever_runs_beside_it() -> None:
    found = physics()
    assert found.prefill_s(0) == 0.0
    assert found.prefill_s(2048) == pytest.approx(2 * found.prefill_s(1024))


def test_the_decode_step_follows_aiconfigurator_alone_not_its_queueing() -> None:
    """The host's own closed loop at 16 users: its TPOT near AIConfigurator's at batch 16
    (whose aggregated TTFT and TPOT hold queueing and mixed prefill steps the engine does
    itself, and which counted twice made TPOT 2-4x too slow)."""
    from tuner.plan.estimate import Estimator, PlanPoint
    from tuner.plan.system import backend_version
    from tuner.simulation.physics import estimate

    launch = Launch(model="meta-llama/Meta-Llama-3.1-8B", max_num_seqs=64)
    sim = estimate("h100_sxm", launch)
    version = backend_version("h100_sxm", "")
    reference = Estimator("h100_sxm", version, "meta-llama/Meta-Llama-3.1-8B").estimate(
        PlanPoint(batch=16, isl=1024, osl=128)
    )
    engine, now, rid = Engine(sim), 0.0, 0
    for rid in range(16):
        engine.add(Sequence(rid, 1024, 128, now))
    gaps: list[float] = []
    while len(gaps) < 4000:
        step = engine.step(now)
        now += step.duration_s
        gaps += [step.duration_s] * sum(1 for s in step.tokens if s.generated > 1)
        for _ in step.finished:  # closed loop: each finished user sends the next request
            rid += 1
            engine.add(Sequence(rid, 1024, 128, now))
    tpot_ms = 1000 * sum(gaps) / len(gaps)
    assert reference.tpot_ms / 1.5 < tpot_ms < reference.tpot_ms * 1.5


def test_without_noise_every_launch_serves_at_the_modelled_speed() -> None:
    assert launch_factor(0.0) == 1.0
    assert replace(physics(), launch_factor=launch_factor(0.0)) == physics()


def test_launches_draw_mean_one_factors_of_the_asked_spread() -> None:
    draws = np.array([launch_factor(0.05, np.random.default_rng(seed)) for seed in range(4000)])
    assert draws.mean() == pytest.approx(1.0, abs=0.005)  # noise, not a bias
    assert draws.std() == pytest.approx(0.05, rel=0.1)
    assert draws.min() > 0  # a slowdown or speed-up, never a negative duration


def test_every_launch_draws_its_own_factor() -> None:
    """The default generator is seeded from the OS: two launches are two draws."""
    assert len({launch_factor(0.05) for _ in range(20)}) == 20


def test_a_launch_factor_scales_every_step_the_engine_takes() -> None:
    def durations(factor: float) -> list[float]:
        engine = Engine(replace(physics(budget=512), launch_factor=factor))
        for rid in range(3):
            engine.add(Sequence(rid, prompt_tokens=700, max_tokens=6, arrived_at=0.0))
        return [engine.step(0.0).duration_s for _ in range(8)]

    plain, slow = durations(1.0), durations(1.07)
    assert any(d > 0 for d in plain)  # the prefill steps and the decode steps
    assert slow == pytest.approx([1.07 * d for d in plain], rel=1e-12)


def test_the_noise_cv_must_be_below_one_and_not_negative() -> None:
    assert valid_cv(0.0) and valid_cv(0.05) and valid_cv(0.99)
    assert not valid_cv(-0.01) and not valid_cv(1.0)


def test_a_noisy_rehearsal_says_so_in_its_simulated_line() -> None:
    hardware = {"gpus": ["NVIDIA H100 80GB HBM3 (simulated)"]}
    plain = stamp({"hardware": hardware, "fixed_env": {"TUNER_SIM_NOISE_CV": "0"}})
    noisy = stamp({"hardware": hardware, "fixed_env": {"TUNER_SIM_NOISE_CV": "0.050"}})
    assert plain is not None and "noise" not in plain
    assert noisy == plain + "; serving delays noised per launch, CV 0.05"
    assert noise_cv({}) == "" and noise_cv({"TUNER_SIM_NOISE_CV": "x"}) == "x"


def test_a_rehearsals_progress_lines_say_simulated_not_vllm() -> None:
    from tuner.server.kinds import served_by

    assert served_by("vllm") == "vLLM"
    assert "SIMULATED" in served_by("simulated_gpu") and "vLLM" not in served_by("simulated_gpu")
