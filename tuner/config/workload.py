"""The traffic a trial offers (the ``workload`` config group): request classes, their token-length
distributions, closed- or open-loop arrivals, warm-up and measurement window.

Part of the typed configuration (:mod:`tuner.config` re-exports these classes);
:mod:`tuner.loadgen.request_plan` turns a :class:`WorkloadConfig` into a seeded request plan.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from tuner.errors import ConfigError

LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal", "empirical")


@dataclass
class LengthDist:
    """A token-length distribution. kind: fixed | uniform | normal | lognormal | empirical.

    ``empirical`` is a fitted one (``tuner workload fit``): ``quantiles`` are the lengths at
    evenly spaced probabilities 0, 1/(n-1), ..., 1, drawn by interpolating between them.
    Every kind but ``fixed`` varies: ``uniform`` without ``std`` spans ``[low, high]`` (and its
    ``mean`` must be their midpoint), with ``std`` it spans mean ± √3·std; ``normal`` and
    ``lognormal`` need ``std > 0``. Draws are limited to ``[low, high]``.
    """

    kind: str = "fixed"
    mean: float = 128.0
    std: float = 0.0
    low: int = 1
    high: int = 1_000_000
    quantiles: list[float] = field(default_factory=list)  # kind empirical only

    def validate(self, where: str) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ConfigError(
                f"{where}.kind={self.kind!r} is unknown",
                hint=f"use one of {', '.join(LENGTH_KINDS)}",
            )
        if self.kind == "empirical":
            self._validate_quantiles(where)
        if self.mean < 1 or self.low < 1 or self.high < self.low or self.std < 0:
            raise ConfigError(f"{where}: need mean >= 1, 1 <= low <= high, std >= 0")
        if not self.low <= self.mean <= self.high:
            # the lengths are limited to [low, high], so their mean could never be the asked one
            raise ConfigError(f"{where}: mean={self.mean:g} is outside [{self.low}, {self.high}]")
        self._validate_spread(where)

    def _validate_quantiles(self, where: str) -> None:
        q = self.quantiles
        if len(q) < 2 or q[0] < 1 or any(b < a for a, b in itertools.pairwise(q)):
            raise ConfigError(
                f"{where}: kind=empirical needs >= 2 quantiles, >= 1 and non-decreasing",
                hint="write it with `tuner workload fit`, or list lengths at even probabilities",
            )

    def _validate_spread(self, where: str) -> None:
        """Refuse a declared distribution that could never vary, or whose range and mean
        disagree: either would silently send other lengths than the config names."""
        if self.kind in ("normal", "lognormal") and self.std == 0:
            raise ConfigError(
                f"{where}: kind={self.kind} with std=0 never varies",
                hint="give std > 0, or use kind: fixed for one length",
            )
        midpoint = (self.low + self.high) / 2
        if self.kind == "uniform" and self.std == 0 and abs(self.mean - midpoint) > 0.5:
            raise ConfigError(
                f"{where}: a uniform without std spans [low, high] = [{self.low}, {self.high}], "
                f"whose mean is {midpoint:g}, not mean={self.mean:g}",
                hint="set low and high around the mean, or give std (mean ± √3·std)",
            )


@dataclass
class RequestClass:
    """One kind of request in the traffic mix."""

    name: str = "default"
    weight: float = 1.0
    api: str = "completions"  # completions | chat
    prompt_tokens: LengthDist = field(default_factory=lambda: LengthDist(mean=256))
    output_tokens: LengthDist = field(default_factory=lambda: LengthDist(mean=64))
    # vLLM's request priority (lower is served earlier), sent with each of the class's requests
    # to a server that schedules by priority (--scheduling-policy priority); a server on FCFS
    # refuses any priority but 0, so it is left out there
    priority: int = 0


@dataclass
class TraceClass:
    """One class of a rule on a trace request's recorded prompt length: a request belongs to the
    first class whose ``max_prompt_tokens`` it does not exceed; the last may have no bound."""

    name: str = ""
    max_prompt_tokens: int | None = None


def check_class_rule(
    rule: Sequence[TraceClass], where: str, known: Collection[str] | None = None
) -> None:
    """Refuse a prompt-length rule that could not class every request once: an empty or
    repeated name, a name ``known`` lacks (the workload's classes), a bound < 1, bounds that
    do not increase, or an unbounded class before the last. ``where`` names the key."""
    seen: dict[str, int] = {}
    for i, rc in enumerate(rule):
        key = f"{where}[{i}]"
        if not rc.name:
            raise ConfigError(f"{key}.name is empty", hint="name one of the workload's classes")
        if rc.name in seen:
            raise ConfigError(f"{key}.name={rc.name!r} is already {where}[{seen[rc.name]}]'s")
        seen[rc.name] = i
        if known is not None and rc.name not in known:
            raise ConfigError(
                f"{key}.name={rc.name!r} is not a class of the workload (workload.classes: "
                f"{', '.join(known) or 'none'})",
                hint="add it to workload.classes: its api, priority and SLOs apply to its requests",
            )
        bound = rc.max_prompt_tokens
        if bound is None:
            if i != len(rule) - 1:
                raise ConfigError(
                    f"{key} ({rc.name!r}) has no max_prompt_tokens but is not the last class",
                    hint="only the last class may be unbounded: it takes every longer prompt",
                )
            continue
        if bound < 1:
            raise ConfigError(f"{key}.max_prompt_tokens={bound} must be >= 1")
        before = rule[i - 1].max_prompt_tokens if i else None
        if before is not None and bound <= before:
            raise ConfigError(
                f"{key}.max_prompt_tokens={bound} does not increase ({where}[{i - 1}] "
                f"({rule[i - 1].name!r}) ends at {before})",
                hint="list the classes from the shortest prompts up: first match wins",
            )


@dataclass
class TraceConfig:
    """A trace replayed open loop by its timestamps (``workload=trace``).

    The replay sends the requests of ``[start_s, start_s + duration_s)`` of the trace, its clock
    divided by ``rate_scale`` (2 = twice as fast); without ``duration_s`` it replays what the
    warm-up and window last. Prompts longer than ``max_model_len`` allows (with their output)
    are shortened and counted; unset, the model's ``max_position_embeddings`` is the cap.
    """

    path: str = ""
    layout: str = "auto"  # auto (by the columns) | azure | burstgpt | mooncake | plain
    start_s: float = 0.0
    duration_s: float | None = None
    rate_scale: float = 1.0
    max_model_len: int | None = None
    api: str = "completions"  # completions | chat (of a replay whose requests have no class)
    block_tokens: int = 512  # tokens per prefix block (Mooncake's hash_ids)
    # Each request's class, one of workload.classes (whose api, priority and SLOs then apply):
    # the file's column ``class_column`` (unset: the layout's own, a plain trace's
    # request_class, where the file has it), or else a rule on its recorded prompt length,
    # e.g. [{name: chat, max_prompt_tokens: 512}, {name: documents}] (first match wins).
    class_column: str | None = None
    classes: list[TraceClass] = field(default_factory=list)

    def validate(self, known: Collection[str] | None = None) -> None:
        """``known``: the workload's class names, which a class rule must use."""
        if not self.path:
            raise ConfigError(
                "workload.trace.path is empty", hint="give a trace file (CSV or JSONL)"
            )
        if not os.path.isfile(self.path):
            raise ConfigError(
                f"workload.trace.path {self.path!r} is not a file",
                hint="give a CSV or JSONL trace; a relative path starts where tuner runs",
            )
        if self.rate_scale <= 0:
            raise ConfigError(
                f"workload.trace.rate_scale must be > 0, got {self.rate_scale:g}",
                hint="2 replays the trace twice as fast, 0.5 half as fast",
            )
        if self.start_s < 0 or (self.duration_s is not None and self.duration_s <= 0):
            raise ConfigError("workload.trace: start_s must be >= 0 and duration_s > 0")
        if self.api not in ("completions", "chat") or self.block_tokens < 1:
            raise ConfigError("workload.trace: api must be completions|chat, block_tokens >= 1")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ConfigError(f"workload.trace.max_model_len={self.max_model_len} is too small")
        if self.class_column is not None and not self.class_column:
            raise ConfigError(
                "workload.trace.class_column is empty", hint="name a column, or leave it null"
            )
        if self.class_column and self.classes:
            raise ConfigError(
                f"workload.trace.class_column={self.class_column!r} and workload.trace.classes "
                "both class the trace's requests",
                hint="keep one: the column, or the rule on prompt length",
            )
        check_class_rule(self.classes, "workload.trace.classes", known)


@dataclass
class PrefixConfig:
    """How requests share a prefix: a ``share`` of them open with one of ``prompts`` system
    prompts of ``tokens`` tokens (chosen evenly), the rest with none. The prefix counts in the
    request's prompt length; a prompt shorter than it gets the prefix's start."""

    share: float = 0.0
    prompts: int = 1
    tokens: int = 512

    def validate(self) -> None:
        if not 0.0 <= self.share <= 1.0 or self.prompts < 1 or self.tokens < 1:
            raise ConfigError(
                "workload.prefix: need 0 <= share <= 1, prompts >= 1 and tokens >= 1, got "
                f"share={self.share:g}, prompts={self.prompts}, tokens={self.tokens}"
            )


THINK_KINDS = ("exponential", "fixed")


@dataclass
class SessionConfig:
    """Multi-turn conversations. With ``turns`` > 1 each closed-loop user, or each open-loop
    arrival, holds a conversation of ``turns`` requests of one class. Every turn after the
    first is sent a think time after the previous answer (mean ``think_s``; ``think``:
    exponential or fixed) and opens with the conversation so far: every earlier turn's prompt
    and a stand-in of its answer, of the answer's length. Its own new part has the class's
    prompt length, so a conversation's prompts grow turn by turn, as a chat's do."""

    turns: int = 1
    think_s: float = 0.0
    think: str = "exponential"

    def validate(self) -> None:
        if self.turns < 1 or self.think_s < 0 or self.think not in THINK_KINDS:
            raise ConfigError(
                "workload.sessions: need turns >= 1, think_s >= 0 and think one of "
                f"{', '.join(THINK_KINDS)}, got turns={self.turns}, think_s={self.think_s:g}, "
                f"think={self.think!r}"
            )


@dataclass
class WorkloadConfig:
    """The traffic a trial offers: mix, arrivals, warm-up, window, timeouts."""

    classes: list[RequestClass] = field(default_factory=lambda: [RequestClass()])
    mode: str = "closed"  # closed: `concurrency` users in a loop; open: `rate` req/s arrivals
    concurrency: int = 32
    rate: float = 10.0
    burstiness: float = 1.0  # gamma shape; 1 = Poisson
    warmup_s: float = 5.0
    window_s: float = 30.0
    max_requests: int = 0  # > 0: the window also ends after this many measured requests
    request_timeout_s: float = 120.0
    drain_timeout_s: float = 60.0  # let requests started in the window finish
    dataset: str | None = None  # JSONL of {"prompt": ..., "max_tokens": ...}
    processes: int = 1
    seed: int = 0
    trace: TraceConfig | None = None  # replay this trace open loop (mode must be open)
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)

    def validate(self) -> None:
        if self.mode not in ("closed", "open"):
            raise ConfigError(f"workload.mode must be 'closed' or 'open', got {self.mode!r}")
        if self.concurrency < 1:
            raise ConfigError(f"workload.concurrency must be >= 1, got {self.concurrency}")
        if self.mode == "open" and self.rate <= 0:
            raise ConfigError(f"workload.rate must be > 0 in open mode, got {self.rate}")
        if self.burstiness <= 0:
            raise ConfigError(f"workload.burstiness must be > 0, got {self.burstiness}")
        if self.window_s <= 0 or self.warmup_s < 0 or self.request_timeout_s <= 0:
            raise ConfigError("workload: window_s and request_timeout_s must be > 0, warmup_s >= 0")
        if not self.classes:
            raise ConfigError("workload.classes is empty", hint="give at least one request class")
        for i, rc in enumerate(self.classes):
            if rc.weight <= 0 or rc.api not in ("completions", "chat"):
                raise ConfigError(
                    f"workload.classes[{i}]: weight must be > 0, api completions|chat"
                )
            rc.prompt_tokens.validate(f"workload.classes[{i}].prompt_tokens")
            rc.output_tokens.validate(f"workload.classes[{i}].output_tokens")
        if self.processes < 1:
            raise ConfigError(f"workload.processes must be >= 1, got {self.processes}")
        self.prefix.validate()
        self.sessions.validate()
        if self.sessions.turns > 1 and (self.trace is not None or self.dataset):
            raise ConfigError(
                "workload.sessions.turns > 1 makes synthetic conversations; a trace or a "
                "dataset brings its own requests",
                hint="leave workload.sessions.turns=1 (a trace's session ids replay its turns)",
            )
        if self.trace is not None:
            self.trace.validate([rc.name for rc in self.classes])
            if self.mode != "open" or self.dataset:
                raise ConfigError(
                    "workload.trace is replayed open loop by its timestamps",
                    hint="set workload.mode=open and leave workload.dataset unset",
                )
        if self.dataset and not os.path.isfile(self.dataset):
            raise ConfigError(
                f"workload.dataset {self.dataset!r} is not a file",
                hint='give a JSONL file of {"prompt": ...} lines, or leave it unset',
            )
