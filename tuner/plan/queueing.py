"""A closed-loop queueing model: static per-batch estimates -> what a client would measure.

AIConfigurator (and a silicon table measured at a fixed concurrency) gives steady-state means at
a batch of ``c`` running requests: the time to the first token ``ttft`` and the time per output
token ``tpot``. A study measures a server under ``U`` closed-loop users, each sending its next
request the moment the last one ends (no think time), every request ``osl`` output tokens long.
The model, written down once:

- Running requests ``c = min(U, max_num_seqs, kv_slots)``: the engine runs as many as the users
  offer, its cap allows and its KV cache holds (``kv_slots`` = KV tokens // tokens per request;
  beyond that vLLM would preempt, so the extra requests wait as if capped). ``c < 1`` means the
  server cannot hold one request: a failed start.
- Service time of one admitted request: ``S = ttft + (osl - 1) * tpot`` (the estimate at batch c).
- Throughput (Little's law on the running batch): ``X = c / S`` requests/s; output tokens/s
  ``X * osl``.
- Response time (Little's law on the closed loop): ``R = U / X = (U / c) * S``; the mean wait in
  the queue before admission is ``W = R - S = (U / c - 1) * S``.
- Tails: requests are admitted first come first served as slots free, so a request waits at most
  ``ceil(U / c) - 1`` whole service times: P99 wait = ``(ceil(U / c) - 1) * S``. The static
  estimate has no spread of its own, so the P50 and P99 of TTFT add the mean and the P99 wait to
  ``ttft``; TPOT is the same every step (P50 = P99 = ``tpot``, waiting adds no TPOT); E2E adds
  the wait to ``S``.
- Per GPU: output tokens/s / GPUs (TP); per user (interactivity, the other axis of vLLM's
  plot_pareto and of public leaderboards): 1 / TPOT.

Hand-computed case (tests/unit/test_queueing.py): U = 8, cap 4, ttft 0.1 s, tpot 0.01 s,
osl 11 -> S = 0.2 s, X = 20 req/s, 220 tok/s, mean wait 0.2 s, P99 TTFT 0.3 s, P99 E2E 0.4 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """The closed-loop workload: users and the length of every request."""

    users: int
    isl: int
    osl: int

    @property
    def tokens_per_request(self) -> int:
        return self.isl + self.osl


@dataclass(frozen=True)
class Served:
    """What a client would measure from one server under :class:`Load` (None: failed start)."""

    running: int  # c: requests running at once
    request_per_s: float
    output_tok_s: float
    p50_ttft_s: float
    p99_ttft_s: float
    tpot_s: float
    p50_e2e_s: float
    p99_e2e_s: float


def running(load: Load, max_num_seqs: int, kv_slots: int | None = None) -> int:
    """c = min(U, cap, KV slots): how many requests run at once (0: none fits)."""
    c = min(load.users, max_num_seqs)
    return c if kv_slots is None else min(c, kv_slots)


def serve(load: Load, c: int, ttft_s: float, tpot_s: float) -> Served | None:
    """The client's view of ``c`` running requests whose static estimate is (ttft, tpot)."""
    if c < 1:
        return None
    service = ttft_s + (load.osl - 1) * tpot_s
    x = c / service
    mean_wait = (load.users / c - 1) * service
    p99_wait = (math.ceil(load.users / c) - 1) * service
    return Served(
        running=c,
        request_per_s=x,
        output_tok_s=x * load.osl,
        p50_ttft_s=ttft_s + mean_wait,
        p99_ttft_s=ttft_s + p99_wait,
        tpot_s=tpot_s,
        p50_e2e_s=service + mean_wait,
        p99_e2e_s=service + p99_wait,
    )
