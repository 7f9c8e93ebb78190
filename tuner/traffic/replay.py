"""A workload's trace as the requests to replay: the window, the rate scale and the cap
applied, each request's prefix blocks named and its class (one of the workload's) resolved."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tuner.config.workload import RequestClass, TraceConfig, WorkloadConfig
from tuner.errors import ConfigError
from tuner.traffic.prompts import Block, Conversation, shared_prefix_blocks
from tuner.traffic.trace import BLOCKS, PREFIX, SESSION, ClassBy, Trace, TraceOptions, load

# The class of a replay whose trace classes none of its requests (sent with trace.api).
UNCLASSED = "trace"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceRequest:
    """One request of the replay: when (s from the replay's start), how long, which prefix,
    which class (None: the trace classes none)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[Block, ...] = ()
    request_class: str | None = None


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


def class_by(workload: WorkloadConfig) -> ClassBy:
    """How the workload's trace classes its requests: a class column or the prompt-length
    rule of ``workload.trace``, with the workload's classes the only names allowed."""
    cfg = workload.trace or TraceConfig()
    known = tuple(rc.name for rc in workload.classes)
    return ClassBy(cfg.class_column, tuple(cfg.classes), known)


def replay_requests(workload: WorkloadConfig, tokenizer_path: str) -> list[TraceRequest]:
    """The requests the workload's trace replays, in arrival order, each with its class where
    the trace has classes; what the reader dropped or the cap clipped is logged."""
    cfg = workload.trace or TraceConfig()
    layout = None if cfg.layout == "auto" else cfg.layout
    trace = load(cfg.path, trace_options(workload, tokenizer_path), layout, class_by(workload))
    for note in trace.notes:
        log.warning("trace %s: %s", cfg.path, note)
    own = _blocks(trace, cfg.block_tokens)
    shared = shared_prefix_blocks(workload.prefix, len(trace), workload.seed)
    named = trace.request_classes
    classes: list[str | None] = [None] * len(trace) if named is None else list(named)
    return [
        TraceRequest(float(t), int(p), int(o), tuple(mine or common), c)
        for t, p, o, mine, common, c in zip(
            trace.arrivals,
            trace.prompt_tokens,
            trace.output_tokens,
            own,
            shared,
            classes,
            strict=True,
        )
    ]


def replay_class(workload: WorkloadConfig, name: str | None) -> RequestClass:
    """The class a replayed request is sent as: the workload's class of that name (its api and
    priority; its SLOs apply to its records), or, for a request the trace does not class,
    ``trace`` with ``workload.trace.api`` and priority 0."""
    if name is None:
        api = workload.trace.api if workload.trace else "completions"
        return RequestClass(name=UNCLASSED, api=api)
    for rc in workload.classes:
        if rc.name == name:
            return rc
    known = ", ".join(rc.name for rc in workload.classes)
    raise ConfigError(
        f"the trace's class {name!r} is not a class of the workload (workload.classes: {known})",
        hint="add it to workload.classes: its api, priority and SLOs apply to its requests",
    )


def check_replay(workload: WorkloadConfig, tokenizer_path: str) -> int:
    """How many requests the workload's trace replays: a window that holds none, or none that
    fits max_model_len, is a ConfigError here, before any server starts, not in a trial after
    its server's start-up. 0 for a workload that replays no trace."""
    if workload.trace is None:
        return 0
    return len(replay_requests(workload, tokenizer_path))
