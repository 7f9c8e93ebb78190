"""The closed-loop queueing model of tuner/plan/queueing.py against hand-computed cases."""

from __future__ import annotations

import pytest

from tuner.plan.queueing import Load, running, serve


def test_users_above_the_cap_wait_whole_service_times() -> None:
    # U = 8 users, cap 4, ttft 0.1 s, tpot 0.01 s, 11 output tokens:
    # S = 0.1 + 10 * 0.01 = 0.2 s; X = 4 / 0.2 = 20 req/s = 220 tok/s;
    # R = 8 / 20 = 0.4 s, mean wait 0.2 s; P99 wait (ceil(8/4) - 1) * 0.2 = 0.2 s.
    load = Load(users=8, isl=100, osl=11)
    s = serve(load, running(load, max_num_seqs=4), ttft_s=0.1, tpot_s=0.01)
    assert s is not None
    assert s.running == 4
    assert s.request_per_s == pytest.approx(20.0)
    assert s.output_tok_s == pytest.approx(220.0)
    assert s.p50_ttft_s == pytest.approx(0.3)
    assert s.p99_ttft_s == pytest.approx(0.3)
    assert s.p50_e2e_s == pytest.approx(0.4)
    assert s.p99_e2e_s == pytest.approx(0.4)
    assert s.tpot_s == pytest.approx(0.01)


def test_the_tail_wait_rounds_up_to_whole_rounds() -> None:
    # U = 6, c = 4: mean wait (6/4 - 1) * S = 0.5 S, but the last admitted waits a whole S.
    load = Load(users=6, isl=10, osl=11)
    s = serve(load, 4, ttft_s=0.1, tpot_s=0.01)
    assert s is not None
    assert s.p50_ttft_s == pytest.approx(0.1 + 0.1)
    assert s.p99_ttft_s == pytest.approx(0.1 + 0.2)


def test_a_cap_at_or_above_the_users_adds_no_wait() -> None:
    load = Load(users=8, isl=100, osl=11)
    s = serve(load, running(load, max_num_seqs=1024), ttft_s=0.1, tpot_s=0.01)
    assert s is not None and s.running == 8
    assert s.p99_ttft_s == pytest.approx(0.1) and s.p99_e2e_s == pytest.approx(0.2)
    assert s.output_tok_s == pytest.approx(8 / 0.2 * 11)


def test_the_kv_cache_limits_the_batch_and_none_fitting_is_a_failed_start() -> None:
    load = Load(users=64, isl=1000, osl=24)
    assert load.tokens_per_request == 1024
    assert running(load, max_num_seqs=256, kv_slots=10) == 10
    assert running(load, max_num_seqs=256, kv_slots=0) == 0
    assert serve(load, 0, ttft_s=0.1, tpot_s=0.01) is None
