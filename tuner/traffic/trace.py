"""Request traces: arrivals with prompt and output token counts, read from the public layouts.

Every layout is one :class:`TraceLayout` in :data:`LAYOUTS` (how its columns map and what unit
its clock has); a file is recognised by its columns, or its layout is named. The result is a
:class:`Trace`: arrival seconds from the first request, token counts, and where the layout has
them, prefix blocks (Mooncake's ``hash_ids``) and session ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.errors import ConfigError

ARRIVAL, PROMPT, OUTPUT = "arrival_s", "prompt_tokens", "output_tokens"
BLOCKS, PREFIX, SESSION = "hash_ids", "prefix_id", "session_id"
# Room left under max_model_len for what the server adds to a prompt (BOS, a chat template).
SPECIAL_TOKENS_RESERVE = 8


@dataclass(frozen=True)
class TraceLayout:
    """How one public trace names its columns, and the unit of its clock."""

    name: str
    arrival: str
    prompt: str
    output: str
    clock: str  # datetime | s | ms
    blocks: str | None = None  # column of prefix block ids (a list per request)
    prefix: str | None = None
    session: str | None = None

    @property
    def required(self) -> tuple[str, str, str]:
        return (self.arrival, self.prompt, self.output)


LAYOUTS: dict[str, TraceLayout] = {
    layout.name: layout
    for layout in (
        TraceLayout("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
        TraceLayout("burstgpt", "Timestamp", "Request tokens", "Response tokens", "s"),
        TraceLayout(
            "mooncake", "timestamp", "input_length", "output_length", "ms", blocks="hash_ids"
        ),
        TraceLayout(
            "plain", ARRIVAL, PROMPT, OUTPUT, "s", prefix=PREFIX, session=SESSION, blocks=BLOCKS
        ),
    )
}


@dataclass
class Trace:
    """Requests in arrival order: columns arrival_s (from the first request), prompt_tokens,
    output_tokens, and optionally hash_ids / prefix_id / session_id."""

    frame: pd.DataFrame
    layout: str
    source: str
    notes: list[str] = field(default_factory=list)  # what reading or options changed

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def arrivals(self) -> np.ndarray:
        return self.frame[ARRIVAL].to_numpy(dtype=float)

    @property
    def prompt_tokens(self) -> np.ndarray:
        return self.frame[PROMPT].to_numpy(dtype=np.int64)

    @property
    def output_tokens(self) -> np.ndarray:
        return self.frame[OUTPUT].to_numpy(dtype=np.int64)

    @property
    def span_s(self) -> float:
        return float(self.arrivals[-1] - self.arrivals[0]) if len(self) else 0.0


@dataclass(frozen=True)
class TraceOptions:
    """What part of a trace to replay, how fast, and under which context length.

    ``start_s``/``duration_s`` pick a window in the trace's own time; ``rate_scale`` 2 replays
    it twice as fast; ``max_model_len`` shortens prompts so prompt + output fit the server."""

    start_s: float = 0.0
    duration_s: float | None = None
    rate_scale: float = 1.0
    max_model_len: int | None = None


def _read_frame(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(
            f"trace file {str(path)!r} does not exist",
            hint="give a CSV or JSONL trace (Azure, BurstGPT, Mooncake or arrival_s/"
            "prompt_tokens/output_tokens columns)",
        )
    try:
        if path.suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=True)
        return pd.read_csv(path)
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot read trace {str(path)!r}: {first}") from exc


def detect_layout(columns: list[str], where: str) -> TraceLayout:
    """The layout whose arrival, prompt and output columns the file has."""
    for layout in LAYOUTS.values():
        if set(layout.required) <= set(columns):
            return layout
    raise ConfigError(
        f"trace {where!r} has an unknown layout: columns {', '.join(columns) or '(none)'}",
        hint="use Azure (TIMESTAMP, ContextTokens, GeneratedTokens), BurstGPT, Mooncake or "
        "arrival_s, prompt_tokens, output_tokens; or name the layout",
    )


def _layout(columns: list[str], name: str | None, where: str) -> TraceLayout:
    if name is None or name == "auto":
        return detect_layout(columns, where)
    if name not in LAYOUTS:
        raise ConfigError(
            f"trace layout {name!r} is unknown", hint=f"use one of {', '.join(LAYOUTS)}"
        )
    layout = LAYOUTS[name]
    missing = [c for c in layout.required if c not in columns]
    if missing:
        raise ConfigError(
            f"trace {where!r} lacks the {name} columns {', '.join(missing)} "
            f"(columns found: {', '.join(map(str, columns))})"
        )
    return layout


def _seconds(values: pd.Series, clock: str, where: str) -> np.ndarray:
    """Arrival instants in seconds on the trace's own clock."""
    try:
        if clock == "datetime":
            stamps = pd.to_datetime(values, format="ISO8601")
            return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=float)
        scale = 1e-3 if clock == "ms" else 1.0
        return pd.to_numeric(values).to_numpy(dtype=float) * scale
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"trace {where!r}: arrival times are not {clock} values ({exc})") from exc


def _typed(raw: pd.DataFrame, layout: TraceLayout, where: str) -> pd.DataFrame:
    frame = pd.DataFrame({ARRIVAL: _seconds(raw[layout.arrival], layout.clock, where)})
    for column, source in ((PROMPT, layout.prompt), (OUTPUT, layout.output)):
        values = pd.to_numeric(raw[source], errors="coerce")
        frame[column] = values.fillna(0).astype(np.int64).to_numpy()
    optional = {BLOCKS: layout.blocks, PREFIX: layout.prefix, SESSION: layout.session}
    for column, name in optional.items():
        if name is not None and name in raw.columns:
            frame[column] = raw[name].to_numpy()
    return frame


def read_trace(path: str | Path, layout: str | None = None) -> Trace:
    """A whole trace, sorted by arrival, time from its first request. Requests without a
    prompt or an output token (failed ones, in BurstGPT) are dropped and counted."""
    path = Path(path)
    raw = _read_frame(path)
    columns = [str(c) for c in raw.columns]
    chosen = _layout(columns, layout, str(path))
    frame = _typed(raw, chosen, str(path))
    frame = frame.sort_values(ARRIVAL, kind="stable").reset_index(drop=True)
    notes = []
    empty = (frame[PROMPT] < 1) | (frame[OUTPUT] < 1)
    if empty.any():
        notes.append(f"dropped {int(empty.sum())} requests with 0 prompt or output tokens")
        frame = frame[~empty].reset_index(drop=True)
    if len(frame):
        frame[ARRIVAL] -= frame[ARRIVAL].iloc[0]
    return Trace(frame, chosen.name, str(path), notes)


def select(trace: Trace, options: TraceOptions) -> Trace:
    """The requests of the window, on the replay's clock (from 0, divided by rate_scale), their
    lengths capped to max_model_len."""
    if options.rate_scale <= 0:
        raise ConfigError(
            f"trace rate_scale must be > 0, got {options.rate_scale:g}",
            hint="2 replays the trace twice as fast, 0.5 half as fast",
        )
    t = trace.frame[ARRIVAL]
    inside = t >= options.start_s
    if options.duration_s is not None:
        inside &= t < options.start_s + options.duration_s
    frame = trace.frame[inside].reset_index(drop=True)
    if frame.empty:
        end = "end" if options.duration_s is None else f"{options.start_s + options.duration_s:g} s"
        raise ConfigError(
            f"the trace window [{options.start_s:g} s, {end}) of {trace.source!r} holds no "
            f"requests (the trace spans {trace.span_s:.0f} s)",
            hint="move trace.start_s or widen trace.duration_s",
        )
    frame[ARRIVAL] = (frame[ARRIVAL] - options.start_s) / options.rate_scale
    out = Trace(frame, trace.layout, trace.source, list(trace.notes))
    if options.max_model_len is not None:
        cap_lengths(out, options.max_model_len)
    return out


def cap_lengths(trace: Trace, max_model_len: int) -> int:
    """Shorten prompts so prompt + output (+ the server's own tokens) fit ``max_model_len``;
    count and note what was clipped. A trace none of whose requests fits is refused."""
    budget = max_model_len - SPECIAL_TOKENS_RESERVE
    frame = trace.frame
    room = budget - frame[OUTPUT]
    if (room < 1).all() or (frame[PROMPT] + frame[OUTPUT] > budget).all():
        raise ConfigError(
            f"every request of {trace.source!r} in the window exceeds max_model_len="
            f"{max_model_len} (shortest prompt + output: "
            f"{int((frame[PROMPT] + frame[OUTPUT]).min())} tokens)",
            hint="serve a longer max_model_len, or pick another window of the trace",
        )
    # an output that alone fills the budget is cut to half of it, the prompt gets the rest
    out_clip = room < 1
    frame.loc[out_clip, OUTPUT] = budget // 2
    if out_clip.any():
        trace.notes.append(
            f"clipped {int(out_clip.sum())} outputs to {budget // 2} tokens: alone they "
            f"filled max_model_len={max_model_len}"
        )
    room = budget - frame[OUTPUT]
    clipped = frame[PROMPT] > room
    frame.loc[clipped, PROMPT] = room[clipped]
    n = int(clipped.sum())
    if n:
        trace.notes.append(
            f"clipped {n} of {len(frame)} prompts ({n / len(frame):.1%}) to fit "
            f"max_model_len={max_model_len} with their outputs"
        )
    return n


def load(path: str | Path, options: TraceOptions, layout: str | None = None) -> Trace:
    """Read, window, rescale and cap a trace in one call."""
    return select(read_trace(path, layout), options)


def write_plain(trace: Trace, path: Path) -> None:
    """The trace in the plain JSONL layout (arrival_s, prompt_tokens, output_tokens, ...)."""
    rows = trace.frame.to_dict(orient="records")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
