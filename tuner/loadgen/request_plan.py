"""Workload generation: the request plan (prompts, output lengths, classes) and arrival gaps.

The plan is built once in the parent process, deterministically from ``workload.seed``, and
written as JSONL for the Locust subprocess, which only replays it. Prompts are synthesized to an
exact token count with the model's own tokenizer, like vLLM's random dataset: random non-special
token ids are decoded, re-encoded, and trimmed or extended until the encoding has the target
length. The count is of the prompt text alone (``add_special_tokens=False``); the server adds
its BOS token or chat template on top, and reports the true count in ``usage.prompt_tokens``.

Length distributions draw from the range they name, limited to ``[low, high]``: ``uniform``
without ``std`` is every integer of ``[low, high]`` equally likely, with ``std`` it spans
mean ± √3·std; ``normal`` and ``lognormal`` have the asked ``mean`` and ``std``; ``empirical``
interpolates fitted quantiles; only ``fixed`` is one length. Each draw comes from the workload's
seed, so a plan is the same on every run. A trace (``workload.trace``) is planned request by
request instead, each with its send time (:mod:`tuner.traffic`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
from tuner.errors import ConfigError
from tuner.traffic.fit import empirical_draws
from tuner.traffic.prompts import conversation_blocks, prompt_texts, shared_prefix_blocks
from tuner.traffic.replay import replay_class, replay_requests

MIN_PLAN_SIZE = 512
MAX_PLAN_SIZE = 8192  # ~1 ms per prompt to synthesize; plans are memoized per process
# Plan for requests as short as 1/6 s end to end: the quickstart's (16 users, 64 tokens) took
# 0.38 s at the median on a 2-core Zen 4, but vLLM's defaults on a 2-core EPYC (AVX-512) served
# 4.04 requests/s a user, past a 0.25-s plan by 32 prompts; synthesis is ~1 ms a prompt, done
# while the server starts.
CLOSED_LOOP_REQ_PER_USER_S = 6.0
_SYNTH_ROUNDS = 16  # decode/re-encode rounds before accepting the closest prompt
_POOL_CANDIDATES = 32768  # vocab ids examined for the token pool (bounds the cost on big vocabs)
_MIN_WORD_POOL = 32

# Independent random streams from one seed, so adding a class does not reshuffle the arrivals.
_STREAM_CLASSES, _STREAM_LENGTHS, _STREAM_PROMPTS, _STREAM_DATASET, _STREAM_THINK = 1, 2, 3, 4, 5


@dataclass
class PlannedRequest:
    """One request the client will send; exactly one of ``prompt``/``messages`` is set."""

    request_class: str
    api: str  # completions | chat
    max_tokens: int
    prompt_tokens_target: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    arrival_s: float | None = None  # a trace's: its send time from the start (open loop)
    # A conversation's turn (workload.sessions): the client sends a session's turns in order,
    # each ``think_s`` after the previous answer.
    session: int | None = None
    turn: int = 0
    think_s: float = 0.0
    priority: int = 0  # its class's; sent only to a server that schedules by priority

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


# ---------------------------------------------------------------------------- distributions
def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` integer token lengths drawn from ``dist``, limited to ``[max(1, low), high]``."""
    dist.validate("length distribution")  # a spread-less normal or uniform is refused, not fixed
    low, high = max(1, dist.low), dist.high
    if dist.kind == "fixed":
        values = np.full(n, dist.mean)
    elif dist.kind == "uniform":
        values = _uniform(dist, n, rng)
    elif dist.kind == "normal":
        values = rng.normal(dist.mean, dist.std, n)
    elif dist.kind == "empirical":  # fitted quantiles (tuner workload fit)
        values = empirical_draws(dist.quantiles, n, rng)
    else:  # lognormal, the last kind validate() accepts
        # Solve for the underlying normal so the lognormal itself has the asked mean and std.
        sigma2 = math.log1p((dist.std / dist.mean) ** 2)
        values = rng.lognormal(math.log(dist.mean) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.clip(np.rint(values), low, high).astype(np.int64)


def _uniform(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform lengths: over the integers of ``[low, high]`` when no std is given (the range the
    config names), else over mean ± √3·std (that std) cut to ``[low, high]``."""
    if dist.std == 0:
        return rng.integers(max(1, dist.low), dist.high, size=n, endpoint=True)
    half = math.sqrt(3.0) * dist.std
    return rng.uniform(max(dist.low, dist.mean - half), min(dist.high, dist.mean + half), n)


def pick_classes(classes: Sequence[RequestClass], n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices into ``classes`` for ``n`` requests, drawn in proportion to the weights."""
    weights = np.array([c.weight for c in classes], dtype=float)
    return rng.choice(len(classes), size=n, p=weights / weights.sum())


def arrival_gaps(rate: float, burstiness: float, seed: int, chunk: int = 1024) -> Iterator[float]:
    """Endless open-loop inter-arrival gaps (s): gamma, shape=burstiness, mean 1/rate.

    burstiness 1 is a Poisson process; < 1 is burstier, > 1 more regular (as `vllm bench`).
    """
    rng = np.random.default_rng([seed, 0])
    scale = 1.0 / (rate * burstiness)
    while True:
        yield from rng.gamma(shape=burstiness, scale=scale, size=chunk).tolist()


# ---------------------------------------------------------------------------- tokenizer
def load_tokenizer(path: str) -> Any:
    """A HF tokenizer from a local directory only (never a download)."""
    if not Path(path).is_dir():
        raise ConfigError(
            f"tokenizer directory {path!r} does not exist",
            hint="point the target's tokenizer at a local model or tokenizer folder",
        )
    from transformers import AutoTokenizer  # heavy import: only when a plan is built

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/...: translate them all
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot load a tokenizer from {path!r}: {first}",
            hint="the folder needs tokenizer.json or the files AutoTokenizer expects",
        ) from exc


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(
        tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
    )


class PromptSynthesizer:
    """Random prompts of an exact token length for one tokenizer."""

    def __init__(self, tokenizer: Any, rng: np.random.Generator) -> None:
        self.tokenizer = tokenizer
        self.rng = rng
        self.pool = self._token_pool()

    def _token_pool(self) -> np.ndarray:
        """Token ids that round-trip alone; preferably ' word' tokens, which never merge."""
        special = set(self.tokenizer.all_special_ids)
        ids = [i for i in range(len(self.tokenizer)) if i not in special]
        if len(ids) > _POOL_CANDIDATES:
            ids = sorted(self.rng.choice(ids, _POOL_CANDIDATES, replace=False).tolist())
        texts = [_decode(self.tokenizer, [i]) for i in ids]
        clean = [
            (i, t)
            for i, t in zip(ids, texts, strict=True)
            if t.strip() and "\ufffd" not in t and _encode(self.tokenizer, t) == [i]
        ]
        words = [i for i, t in clean if t[0] == " " and t[1:].isalpha()]
        pool = words if len(words) >= _MIN_WORD_POOL else [i for i, _ in clean]
        if not pool:
            raise ConfigError("the tokenizer has no usable tokens to synthesize prompts from")
        return np.array(pool, dtype=np.int64)

    def _draw(self, n: int) -> list[int]:
        return self.rng.choice(self.pool, size=n).tolist() if n > 0 else []

    def make(self, n_tokens: int) -> str:
        """A prompt whose encoding has ``n_tokens`` tokens (closest found after a few rounds)."""
        ids = self._draw(n_tokens)
        best, best_err = "", math.inf
        for _ in range(_SYNTH_ROUNDS):
            text = _decode(self.tokenizer, ids)
            got = _encode(self.tokenizer, text)
            err = abs(len(got) - n_tokens)
            if err < best_err:
                best, best_err = text, err
            if err == 0:
                break
            ids = got[:n_tokens] if len(got) > n_tokens else got + self._draw(n_tokens - len(got))
        return best


# ---------------------------------------------------------------------------- dataset
@dataclass
class DatasetRow:
    prompt: str
    max_tokens: int | None = None
    request_class: str | None = None


def _parse_row(line: str, where: str) -> DatasetRow:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("prompt"), str):
        raise ConfigError(f'{where}: each line needs {{"prompt": "<text>"}}')
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ConfigError(f"{where}: max_tokens must be a positive integer")
    return DatasetRow(data["prompt"], max_tokens, data.get("request_class"))


def read_dataset(path: str) -> list[DatasetRow]:
    """Rows of a JSONL dataset: {"prompt": str, "max_tokens"?: int, "request_class"?: str}."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read workload.dataset {path!r}: {exc}", hint="give a readable JSONL file"
        ) from exc
    rows = [_parse_row(ln, f"{path}:{i}") for i, ln in enumerate(lines, 1) if ln.strip()]
    if not rows:
        raise ConfigError(f"workload.dataset {path!r} has no prompts")
    return rows


# ---------------------------------------------------------------------------- plan
def plan_size(workload: WorkloadConfig) -> int:
    """How many distinct prompts to prepare, so that a run rarely sends one twice (a repeated
    prompt hits the server's prefix cache and flatters TTFT)."""
    duration = workload.warmup_s + workload.window_s
    if workload.mode == "open":
        expected = workload.rate * duration * 1.25
    else:
        expected = workload.concurrency * duration * CLOSED_LOOP_REQ_PER_USER_S
    return int(min(MAX_PLAN_SIZE, max(MIN_PLAN_SIZE, math.ceil(expected))))


def _planned(rc: RequestClass, text: str, max_tokens: int, n_prompt: int) -> PlannedRequest:
    if rc.api == "chat":
        messages = [{"role": "user", "content": text}]
        return PlannedRequest(
            rc.name, rc.api, max_tokens, n_prompt, messages=messages, priority=rc.priority
        )
    return PlannedRequest(rc.name, rc.api, max_tokens, n_prompt, prompt=text, priority=rc.priority)


def plan_lengths(workload: WorkloadConfig, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class index, prompt length and output length of each of ``size`` planned requests: the
    classes by weight, each length drawn from its class's distribution, all from the seed."""
    which = pick_classes(workload.classes, size, _rng(workload.seed, _STREAM_CLASSES))
    turns = workload.sessions.turns
    if turns > 1:  # a conversation keeps its first turn's class (its API, its lengths)
        which = np.repeat(which[::turns], turns)[:size]
    length_rng = _rng(workload.seed, _STREAM_LENGTHS)
    prompt_len = np.zeros(size, dtype=np.int64)
    output_len = np.zeros(size, dtype=np.int64)
    for k, rc in enumerate(workload.classes):
        mask = which == k
        prompt_len[mask] = sample_lengths(rc.prompt_tokens, int(mask.sum()), length_rng)
        output_len[mask] = sample_lengths(rc.output_tokens, int(mask.sum()), length_rng)
    return which, prompt_len, output_len


def synthesize_plan(workload: WorkloadConfig, tokenizer: Any, size: int) -> list[PlannedRequest]:
    """``size`` random-prompt requests, classes by weight, lengths from each class's dists
    (rounded up to whole conversations with ``workload.sessions``)."""
    turns = workload.sessions.turns
    size = math.ceil(size / turns) * turns
    which, prompt_len, output_len = plan_lengths(workload, size)
    synth = PromptSynthesizer(tokenizer, _rng(workload.seed, _STREAM_PROMPTS))
    if turns > 1:
        blocks = conversation_blocks(workload, prompt_len.tolist(), output_len.tolist())
        prompt_len = np.array([sum(n for _, n in b) for b in blocks], dtype=np.int64)
    else:
        blocks = shared_prefix_blocks(workload.prefix, size, workload.seed)
    texts = prompt_texts(synth, prompt_len.tolist(), blocks, workload.seed)
    plan = [
        _planned(workload.classes[k], text, int(o), int(p))
        for k, text, p, o in zip(which.tolist(), texts, prompt_len, output_len, strict=True)
    ]
    if turns > 1:
        think = think_times(workload, size)
        for i, planned in enumerate(plan):
            planned.session, planned.turn = divmod(i, turns)
            planned.think_s = float(think[i]) if planned.turn else 0.0
    return plan


def think_times(workload: WorkloadConfig, n: int) -> np.ndarray:
    """Seconds each of ``n`` turns waits after the previous answer: exponential or fixed."""
    mean = workload.sessions.think_s
    if workload.sessions.think == "fixed" or mean == 0:
        return np.full(n, mean)
    return _rng(workload.seed, _STREAM_THINK).exponential(mean, n)


def trace_plan(workload: WorkloadConfig, tokenizer_path: str) -> list[PlannedRequest]:
    """The trace's requests in arrival order, each with its send time, exact lengths and class
    (the trace's, sent with that workload class's api and priority)."""
    requests = replay_requests(workload, tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path)
    synth = PromptSynthesizer(tokenizer, _rng(workload.seed, _STREAM_PROMPTS))
    lengths = [r.prompt_tokens for r in requests]
    texts = prompt_texts(synth, lengths, [r.blocks for r in requests], workload.seed)
    plan = []
    for r, text in zip(requests, texts, strict=True):
        rc = replay_class(workload, r.request_class)
        planned = _planned(rc, text, r.output_tokens, r.prompt_tokens)
        planned.arrival_s = r.arrival_s
        plan.append(planned)
    return plan


def _row_class(
    row: DatasetRow, line: int, drawn: RequestClass, by_name: dict[str, RequestClass]
) -> RequestClass:
    if row.request_class is None:
        return drawn
    if row.request_class not in by_name:
        raise ConfigError(
            f"dataset row {line}: unknown request_class {row.request_class!r}",
            hint=f"use one of the workload's classes: {', '.join(by_name)}",
        )
    return by_name[row.request_class]


def dataset_plan(workload: WorkloadConfig, tokenizer: Any) -> list[PlannedRequest]:
    """The dataset's rows in a seeded order; missing classes/max_tokens are drawn."""
    rows = read_dataset(str(workload.dataset))
    by_name = {rc.name: rc for rc in workload.classes}
    rng = _rng(workload.seed, _STREAM_DATASET)
    drawn = pick_classes(workload.classes, len(rows), rng)
    plan = []
    for i in rng.permutation(len(rows)).tolist():
        row = rows[i]
        rc = _row_class(row, i + 1, workload.classes[int(drawn[i])], by_name)
        max_tokens = row.max_tokens or int(sample_lengths(rc.output_tokens, 1, rng)[0])
        plan.append(_planned(rc, row.prompt, max_tokens, len(_encode(tokenizer, row.prompt))))
    return plan


_PLAN_CACHE: dict[str, list[PlannedRequest]] = {}


def build_plan(
    workload: WorkloadConfig, tokenizer_path: str, size: int | None = None
) -> list[PlannedRequest]:
    """The deterministic request plan for ``workload`` (dataset rows, or synthesized prompts)."""
    if workload.dataset:  # read afresh: the file may have changed
        return dataset_plan(workload, load_tokenizer(tokenizer_path))
    if workload.trace is not None:
        replay_s = workload.warmup_s + workload.window_s
        replayed = (workload.trace, workload.classes, workload.prefix, workload.seed)
        key = repr((*replayed, replay_s, tokenizer_path))  # classes: their api and priority
        if key not in _PLAN_CACHE:
            _PLAN_CACHE.clear()
            _PLAN_CACHE[key] = trace_plan(workload, tokenizer_path)
        return list(_PLAN_CACHE[key])
    size = size or plan_size(workload)
    key = repr(
        (workload.classes, workload.prefix, workload.sessions, workload.seed, tokenizer_path, size)
    )
    if key not in _PLAN_CACHE:  # trials of one study share a workload: synthesize it once
        _PLAN_CACHE.clear()
        _PLAN_CACHE[key] = synthesize_plan(workload, load_tokenizer(tokenizer_path), size)
    return list(_PLAN_CACHE[key])


def arrival_shape(plan: Sequence[PlannedRequest]) -> str | None:
    """A timed plan's arrivals (a trace's) in words: how many requests over how long, their
    rate and the coefficient of variation of the gaps between them (1: Poisson-like, > 1
    bursty); None for a plan without arrival times."""
    times = sorted(p.arrival_s for p in plan if p.arrival_s is not None)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    if span <= 0:
        return None
    gaps = np.diff(times)
    cv = float(gaps.std() / gaps.mean())
    rate = (len(times) - 1) / span
    return f"{len(times)} requests over {span:.0f} s, {rate:.2f} req/s, gap CV {cv:.2f}"


def write_plan(path: Path, plan: Sequence[PlannedRequest]) -> None:
    path.write_text("".join(p.to_json() + "\n" for p in plan), encoding="utf-8")


def read_plan(path: Path) -> list[PlannedRequest]:
    with path.open(encoding="utf-8") as fh:
        return [PlannedRequest(**json.loads(line)) for line in fh if line.strip()]
