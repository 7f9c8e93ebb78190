"""Prompts that share prefixes: identical blocks of token ids, then a random tail, to an exact
token count.

A block is named by a key (``sys:2`` for the third shared system prompt, ``hash:17`` for
Mooncake's hash id 17, ``prefix:a`` for a plain trace's prefix id) and its ids are drawn from the
key alone, so every request naming it opens with the same text and the server's prefix cache
can serve it. Only the tail is adjusted until the prompt has its exact length.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from tuner.config.workload import PrefixConfig, WorkloadConfig

log = logging.getLogger(__name__)
Block = tuple[str, int]  # (key, tokens)
_ROUNDS = 16  # decode/re-encode rounds before accepting the closest prompt
_STREAM_PREFIX_CHOICE = 11


class Synthesizer(Protocol):
    """What :class:`tuner.loadgen.request_plan.PromptSynthesizer` offers: a tokenizer, its pool of
    token ids that round-trip alone, a seeded generator, and prompts without a prefix."""

    tokenizer: Any
    pool: np.ndarray
    rng: np.random.Generator

    def make(self, n_tokens: int) -> str: ...


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(
        tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
    )


class PrefixedPrompts:
    """Exact-length prompts that open with named blocks of token ids."""

    def __init__(self, synth: Synthesizer, seed: int) -> None:
        self.synth = synth
        self.seed = seed
        self._blocks: dict[Block, list[int]] = {}

    def block(self, key: str, tokens: int) -> list[int]:
        """The ids of one block: the same for every request (and run) that names it."""
        if (key, tokens) not in self._blocks:
            rng = np.random.default_rng([self.seed, zlib.crc32(key.encode())])
            self._blocks[(key, tokens)] = rng.choice(self.synth.pool, size=tokens).tolist()
        return self._blocks[(key, tokens)]

    def make(self, n_tokens: int, blocks: Sequence[Block]) -> str:
        if not blocks:
            return self.synth.make(n_tokens)
        head = [i for key, tokens in blocks for i in self.block(key, tokens)][:n_tokens]
        tail = self._draw(n_tokens - len(head))
        best, best_err = "", math.inf
        for _ in range(_ROUNDS):
            text = _decode(self.synth.tokenizer, head + tail)
            got = _encode(self.synth.tokenizer, text)
            err = abs(len(got) - n_tokens)
            if err < best_err:
                best, best_err = text, err
            if err == 0:
                break
            # keep the head's ids: only the tail moves, so the prefix text stays the same
            tail = got[len(head) : n_tokens] + self._draw(n_tokens - len(got))
        return best

    def _draw(self, n: int) -> list[int]:
        return self.synth.rng.choice(self.synth.pool, size=n).tolist() if n > 0 else []


def prompt_texts(
    synth: Synthesizer, lengths: Sequence[int], blocks: Sequence[Sequence[Block]], seed: int
) -> list[str]:
    """One prompt per request: ``lengths[i]`` tokens opening with ``blocks[i]``."""
    maker = PrefixedPrompts(synth, seed)
    return [maker.make(int(n), b) for n, b in zip(lengths, blocks, strict=True)]


class Conversation:
    """The blocks of one multi-turn conversation: each turn opens with the conversation so far
    (every earlier turn's new part and a stand-in of its answer, as blocks of their own), then
    its own new part as a block, so the next turn repeats it exactly."""

    def __init__(self, key: str, opening: Sequence[Block] = ()) -> None:
        self.key = key
        self.history: list[Block] = list(opening)
        self.turns = 0

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.history)

    def turn(self, new_tokens: int, output_tokens: int, tag: int | None = None) -> list[Block]:
        """This turn's blocks; its answer joins the history for the next."""
        tag = self.turns if tag is None else tag
        self.turns += 1
        mine = (
            [*self.history, (f"{self.key}:{tag}:in", new_tokens)]
            if new_tokens
            else list(self.history)
        )
        self.history = [*mine, (f"{self.key}:{tag}:out", output_tokens)]
        return mine


def shared_prefix_blocks(prefix: PrefixConfig, n: int, seed: int) -> list[list[Block]]:
    """Which requests open with a shared system prompt (a ``share`` of them, seeded), and
    which of the ``prompts`` each gets."""
    if prefix.share <= 0:
        return [[] for _ in range(n)]
    rng = np.random.default_rng([seed, _STREAM_PREFIX_CHOICE])
    shared = rng.random(n) < prefix.share
    which = rng.integers(0, prefix.prompts, size=n)
    return [
        [(f"sys:{k}", prefix.tokens)] if s else []
        for s, k in zip(shared, which.tolist(), strict=True)
    ]


def conversation_blocks(
    workload: WorkloadConfig, new_tokens: Sequence[int], output_tokens: Sequence[int]
) -> list[list[Block]]:
    """Each request's blocks when requests come ``workload.sessions.turns`` to a conversation:
    a conversation opens with its shared system prompt, if it draws one (kept whole), and each
    turn carries every earlier turn and a stand-in of its answer before its own new part."""
    turns = workload.sessions.turns
    sessions = math.ceil(len(new_tokens) / turns)
    openings = shared_prefix_blocks(workload.prefix, sessions, workload.seed)
    out: list[list[Block]] = []
    for i, (new, output) in enumerate(zip(new_tokens, output_tokens, strict=True)):
        session, turn = divmod(i, turns)
        if turn == 0:
            talk = Conversation(f"conv:{session}", openings[session])
            new = max(0, new - talk.tokens)  # the first prompt's length includes its system prompt
        out.append(talk.turn(new, output))
    return out
