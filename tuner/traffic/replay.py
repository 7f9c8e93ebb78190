"""A workload's trace as the requests to replay: the window, the rate scale and the cap
applied, each request's prefix blocks named."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tuner.config.workload import TraceConfig, WorkloadConfig
from tuner.traffic.prompts import Block, Conversation, shared_prefix_blocks
from tuner.traffic.trace import BLOCKS, PREFIX, SESSION, Trace, TraceOptions, load

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceRequest:
    """One request of the replay: when (s from the replay's start), how long, which prefix."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[Block, ...] = ()


def model_max_len(tokenizer_path: str) -> int | None:
    """The model's own context length (config.json's max_position_embeddings), if it says."""
    path = Path(tokenizer_path) / "config.json"
    try:
        value = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) else None


def trace_options(workload: WorkloadConfig, tokenizer_path: str) -> TraceOptions:
    cfg: TraceConfig = workload.trace or TraceConfig()
    replay_s = workload.warmup_s + workload.window_s
    duration = cfg.duration_s if cfg.duration_s is not None else replay_s * cfg.rate_scale
    cap = cfg.max_model_len or model_max_len(tokenizer_path)
    return TraceOptions(cfg.start_s, duration, cfg.rate_scale, cap)


def _session_blocks(trace: Trace) -> list[list[Block]]:
    """Multi-turn sessions, each a :class:`Conversation`: a turn's prompt is the conversation so
    far and its new part. A request without a session id opens with nothing."""
    talks: dict[str, Conversation] = {}
    out: list[list[Block]] = []
    rows = zip(trace.frame[SESSION], trace.prompt_tokens, trace.output_tokens, strict=True)
    for turn, (session, prompt, output) in enumerate(rows):
        if pd.isna(session):
            out.append([])
            continue
        talk = talks.setdefault(str(session), Conversation(f"turn:{session}"))
        out.append(talk.turn(max(0, int(prompt) - talk.tokens), int(output), tag=turn))
    return out


def _blocks(trace: Trace, block_tokens: int) -> list[list[Block]]:
    """Each request's own prefix blocks: Mooncake hash ids, a plain trace's session (the
    conversation so far) or prefix id."""
    frame = trace.frame
    if SESSION in frame.columns and frame[SESSION].notna().any():
        return _session_blocks(trace)
    if BLOCKS in frame.columns:
        return [
            [(f"hash:{h}", block_tokens) for h in ids] if isinstance(ids, list) else []
            for ids in frame[BLOCKS]
        ]
    if PREFIX in frame.columns:
        return [[(f"prefix:{p}", block_tokens)] if pd.notna(p) else [] for p in frame[PREFIX]]
    return [[] for _ in range(len(frame))]


def replay_requests(workload: WorkloadConfig, tokenizer_path: str) -> list[TraceRequest]:
    """The requests the workload's trace replays, in arrival order; what the reader dropped or
    the cap clipped is logged."""
    cfg = workload.trace or TraceConfig()
    layout = None if cfg.layout == "auto" else cfg.layout
    trace = load(cfg.path, trace_options(workload, tokenizer_path), layout)
    for note in trace.notes:
        log.warning("trace %s: %s", cfg.path, note)
    own = _blocks(trace, cfg.block_tokens)
    shared = shared_prefix_blocks(workload.prefix, len(trace), workload.seed)
    return [
        TraceRequest(float(t), int(p), int(o), tuple(mine or common))
        for t, p, o, mine, common in zip(
            trace.arrivals, trace.prompt_tokens, trace.output_tokens, own, shared, strict=True
        )
    ]


def check_replay(workload: WorkloadConfig, tokenizer_path: str) -> int:
    """How many requests the workload's trace replays: a window that holds none, or none that
    fits max_model_len, is a ConfigError here, before any server starts, not in a trial after
    its server's start-up. 0 for a workload that replays no trace."""
    if workload.trace is None:
        return 0
    return len(replay_requests(workload, tokenizer_path))
