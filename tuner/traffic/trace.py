"""Request traces: arrivals with prompt and output token counts, read from the public layouts.

Every layout is one :class:`TraceLayout` in :data:`LAYOUTS` (how its columns map and what unit
its clock has); a file is recognised by its columns, or its layout is named. The result is a
:class:`Trace`: arrival seconds from the first request, token counts, and where the layout has
them, prefix blocks (Mooncake's ``hash_ids``) and session ids. A request's class
(``request_class``) comes from a class column of the file, or from a rule on its prompt length
(:class:`ClassBy`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.config.workload import TraceClass
from tuner.errors import ConfigError

ARRIVAL, PROMPT, OUTPUT = "arrival_s", "prompt_tokens", "output_tokens"
BLOCKS, PREFIX, SESSION, CLASS = "hash_ids", "prefix_id", "session_id", "request_class"
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
    request_class: str | None = None  # the column naming each request's class, where it has one

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
            "plain",
            ARRIVAL,
            PROMPT,
            OUTPUT,
            "s",
            prefix=PREFIX,
            session=SESSION,
            blocks=BLOCKS,
            request_class=CLASS,
        ),
    )
}


@dataclass
class Trace:
    """Requests in arrival order: columns arrival_s (from the first request), prompt_tokens,
    output_tokens, and optionally hash_ids / prefix_id / session_id / request_class."""

    frame: pd.DataFrame
    layout: str
    source: str
    notes: list[str] = field(default_factory=list)  # what reading or options changed
    class_order: tuple[str, ...] = ()  # the classes of the rule that classed it, in its order

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

    @property
    def request_classes(self) -> list[str] | None:
        """Each request's class; None for a trace whose requests have none."""
        if CLASS not in self.frame.columns:
            return None
        return [str(c) for c in self.frame[CLASS]]

    @property
    def class_names(self) -> list[str]:
        """The classes of its requests, in the order of the rule that classed them (a column's
        sorted by name); [] for a trace without classes."""
        if CLASS not in self.frame.columns:
            return []
        present = {str(name) for name in self.frame[CLASS]}
        listed = [name for name in self.class_order if name in present]
        return listed + sorted(present - set(listed))


@dataclass(frozen=True)
class ClassBy:
    """How a trace's requests get their class: the file's column ``column`` (None: the
    layout's own, where the file has it), or ``rule`` on their recorded prompt length. ``known``
    (the workload's classes) are the only names a column may hold; None: any. The keys name
    the options in errors."""

    column: str | None = None
    rule: tuple[TraceClass, ...] = ()
    known: tuple[str, ...] | None = None
    column_key: str = "workload.trace.class_column"
    rule_key: str = "workload.trace.classes"


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


def _row(i: int) -> str:
    """A request's place in the file: its row of requests, 1-based (a CSV's line is one more,
    its header being line 1)."""
    return f"row {i + 1}"


def rule_classes(
    prompts: np.ndarray, rule: Sequence[TraceClass], where: str, key: str
) -> np.ndarray:
    """Each prompt length's class by the rule: the first class whose max_prompt_tokens it does
    not exceed. A prompt over every bound (the last class being bounded) is refused."""
    bounds = [np.inf if r.max_prompt_tokens is None else r.max_prompt_tokens for r in rule]
    index = np.searchsorted(np.asarray(bounds, dtype=float), prompts, side="left")
    over = np.flatnonzero(index >= len(rule))
    if len(over):
        i = int(over[0])
        last = rule[-1]
        raise ConfigError(
            f"trace {where!r} {_row(i)}: a prompt of {int(prompts[i])} tokens is over every "
            f"class of {key} (the last, {last.name!r}, ends at {last.max_prompt_tokens}; "
            f"{len(over)} such requests)",
            hint="leave the last class without max_prompt_tokens: it takes every longer prompt",
        )
    names = np.array([r.name for r in rule], dtype=object)
    return names[index]


def _column_classes(raw: pd.DataFrame, column: str, by: ClassBy, where: str) -> np.ndarray:
    values = raw[column]
    names = values.astype(str).str.strip()
    missing = values.isna().to_numpy() | (names == "").to_numpy()
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise ConfigError(
            f"trace {where!r} {_row(i)}: no {column} ({int(missing.sum())} requests lack one)",
            hint=f"give every request its class in {column}, or drop the column",
        )
    if by.known is not None:
        unknown = ~names.isin(by.known).to_numpy()
        if unknown.any():
            i = int(np.flatnonzero(unknown)[0])
            raise ConfigError(
                f"trace {where!r} {_row(i)}: {column}={names.iloc[i]!r} is not a class of the "
                f"workload (workload.classes: {', '.join(by.known) or 'none'})",
                hint="add it to workload.classes (its api, priority and SLOs then apply), "
                "or correct the trace",
            )
    return names.to_numpy(dtype=object)


def _request_classes(
    raw: pd.DataFrame, prompts: np.ndarray, layout: TraceLayout, by: ClassBy, where: str
) -> np.ndarray | None:
    """Each request's class, in the file's order; None where neither a column nor a rule
    classes them."""
    columns = [str(c) for c in raw.columns]
    if by.column is not None and by.column not in columns:
        raise ConfigError(
            f"{by.column_key}={by.column!r} is not a column of trace {where!r} (columns: "
            f"{', '.join(columns)})",
            hint="name the column that holds each request's class",
        )
    own = layout.request_class if layout.request_class in columns else None
    column = by.column or own
    if column is not None and by.rule:
        raise ConfigError(
            f"{by.rule_key} and the class column {column!r} of trace {where!r} both class its "
            "requests",
            hint="keep one: drop the rule on prompt length, or use a trace without the column",
        )
    if column is not None:
        return _column_classes(raw, column, by, where)
    if by.rule:
        return rule_classes(prompts, by.rule, where, by.rule_key)
    return None


def read_trace(
    path: str | Path, layout: str | None = None, classes: ClassBy | None = None
) -> Trace:
    """A whole trace, sorted by arrival, time from its first request, each request classed
    by ``classes`` (where a column or a rule does). Requests without a prompt or an output
    token (failed ones, in BurstGPT) are dropped and counted."""
    path = Path(path)
    raw = _read_frame(path)
    columns = [str(c) for c in raw.columns]
    chosen = _layout(columns, layout, str(path))
    frame = _typed(raw, chosen, str(path))
    by = classes or ClassBy()
    classed = _request_classes(raw, frame[PROMPT].to_numpy(), chosen, by, str(path))
    if classed is not None:
        frame[CLASS] = classed
    frame = frame.sort_values(ARRIVAL, kind="stable").reset_index(drop=True)
    notes = []
    empty = (frame[PROMPT] < 1) | (frame[OUTPUT] < 1)
    if empty.any():
        notes.append(f"dropped {int(empty.sum())} requests with 0 prompt or output tokens")
        frame = frame[~empty].reset_index(drop=True)
    if len(frame):
        frame[ARRIVAL] -= frame[ARRIVAL].iloc[0]
    order = tuple(r.name for r in by.rule) if classed is not None else ()
    return Trace(frame, chosen.name, str(path), notes, order)


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
    out = Trace(frame, trace.layout, trace.source, list(trace.notes), trace.class_order)
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


def load(
    path: str | Path,
    options: TraceOptions,
    layout: str | None = None,
    classes: ClassBy | None = None,
) -> Trace:
    """Read, class, window, rescale and cap a trace in one call."""
    return select(read_trace(path, layout, classes), options)


def write_plain(trace: Trace, path: Path) -> None:
    """The trace in the plain JSONL layout (arrival_s, prompt_tokens, output_tokens, ...)."""
    rows = trace.frame.to_dict(orient="records")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
