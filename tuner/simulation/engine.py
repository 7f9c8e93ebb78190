"""Continuous batching as vLLM's scheduler does it, one engine step at a time.

Each step runs every admitted sequence: those past their prefill decode one token, and what is
left of the step's token budget (``max_num_batched_tokens``) goes to prompts still in prefill,
in arrival order (chunked prefill). A waiting request is admitted while the running batch is
under ``max_num_seqs`` and the KV cache has room for its prompt and output; the first that does
not fit holds the queue, as in vLLM's FIFO policy. The step lasts what the physics says for
that batch and those prefill tokens. Nothing here sleeps: the server turns durations into time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tuner.simulation.physics import Physics


@dataclass
class Sequence:
    """One request inside the engine."""

    rid: int
    prompt_tokens: int
    max_tokens: int
    arrived_at: float
    admitted_at: float | None = None
    prefilled: int = 0
    generated: int = 0

    @property
    def kv_need(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prompt_tokens

    @property
    def done(self) -> bool:
        return self.generated >= self.max_tokens


@dataclass
class Step:
    """What one engine step did: how long it took and which sequences got a token."""

    duration_s: float
    tokens: list[Sequence] = field(default_factory=list)  # one new token each
    finished: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    prefill_tokens: int = 0


class Engine:
    """The scheduler's state: the waiting queue, the running batch and the KV cache in use."""

    def __init__(self, physics: Physics) -> None:
        self.physics = physics
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_used = 0

    @property
    def limits(self) -> tuple[int, int, int]:
        launch = self.physics.launch
        return launch.max_num_seqs, launch.max_num_batched_tokens, self.physics.kv_tokens

    @property
    def kv_usage(self) -> float:
        return self.kv_used / max(self.physics.kv_tokens, 1)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a request whose client went away, freeing its KV cache."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv_used -= seq.kv_need
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _admit(self, now: float) -> list[Sequence]:
        max_seqs, _, kv_tokens = self.limits
        admitted = []
        while self.waiting and len(self.running) < max_seqs:
            head = self.waiting[0]
            # A request larger than the whole cache runs alone rather than never.
            if self.kv_used + head.kv_need > kv_tokens and self.running:
                break
            self.waiting.popleft()
            head.admitted_at = now
            self.kv_used += head.kv_need
            self.running.append(head)
            admitted.append(head)
        return admitted

    def step(self, now: float) -> Step:
        """Admit, then run one step of the running batch; an idle engine's step is empty."""
        admitted = self._admit(now)
        if not self.running:
            return Step(0.0)
        _, budget, _ = self.limits
        decoding = [s for s in self.running if s.decoding]
        budget -= len(decoding)
        prefill, got_first = 0, list[Sequence]()
        for seq in self.running:
            if seq.decoding or budget <= 0:
                continue
            chunk = min(seq.prompt_tokens - seq.prefilled, budget)
            seq.prefilled += chunk
            budget -= chunk
            prefill += chunk
            if seq.decoding:
                got_first.append(seq)
        batch = len(self.running)
        duration = self.physics.prefill_s(prefill)
        if decoding:
            duration += self.physics.step_s(batch)
        tokens = decoding + got_first
        for seq in tokens:
            seq.generated += 1
        finished = [s for s in tokens if s.done]
        for seq in finished:
            self.running.remove(seq)
            self.kv_used -= seq.kv_need
        return Step(duration, tokens, finished, admitted, prefill)
