"""``tuner workload fit``: a workload YAML fitted to a trace or to a running vLLM's metrics,
with its fidelity printed (and written as a comment at its top). A trace with request classes
(its class column, or ``--class-by-prompt chat:512,documents``) is fitted class by class."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner.config.workload import TraceClass, check_class_rule
from tuner.errors import ArtifactError, ConfigError
from tuner.traffic.fit import Fit, fit_trace
from tuner.traffic.metrics_fit import fit_metrics
from tuner.traffic.trace import ClassBy, TraceOptions, read_trace, select

RULE_OPTION, COLUMN_OPTION = "--class-by-prompt", "--class-column"

# The keys a fitted workload file sets; the rest keep WorkloadConfig's defaults.
_WRITTEN = (
    "mode",
    "rate",
    "burstiness",
    "concurrency",
    "warmup_s",
    "window_s",
    "request_timeout_s",
    "drain_timeout_s",
    "seed",
)


@dataclass(frozen=True)
class FitRequest:
    """What ``tuner workload fit`` was asked."""

    out: Path
    trace: Path | None = None
    metrics_url: str | None = None
    layout: str | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    rate_scale: float = 1.0
    window_s: float = 60.0
    max_model_len: int | None = None  # cap the lengths as a replay on such a server would
    class_by_prompt: str | None = None  # a rule on prompt length: "chat:512,documents"
    class_column: str | None = None  # the trace's column of request classes (else the layout's)


def parse_class_rule(text: str) -> list[TraceClass]:
    """``--class-by-prompt``: ``name:max_prompt_tokens`` items, comma-separated, the last one
    maybe a bare name (no bound), checked as ``workload.trace.classes`` is."""
    rule = []
    for item in text.split(","):
        name, colon, bound = (part.strip() for part in item.partition(":"))
        if colon and not bound.isdigit():
            raise ConfigError(
                f"{RULE_OPTION} {item.strip()!r}: the bound must be a whole number of tokens",
                hint=f"e.g. {RULE_OPTION} chat:512,documents (the last may have no bound)",
            )
        rule.append(TraceClass(name, int(bound) if colon else None))
    check_class_rule(rule, RULE_OPTION)
    return rule


def _class_by(request: FitRequest) -> ClassBy:
    if request.class_by_prompt is not None and request.class_column is not None:
        raise ConfigError(
            f"{RULE_OPTION} and {COLUMN_OPTION} both class the trace's requests",
            hint="keep one: the column, or the rule on prompt length",
        )
    text = request.class_by_prompt
    rule = () if text is None else tuple(parse_class_rule(text))
    return ClassBy(request.class_column, rule, None, COLUMN_OPTION, RULE_OPTION)


def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


def _dist(d: Any) -> dict[str, Any]:
    keys = ("kind", "mean", "low", "high")
    return {**{k: getattr(d, k) for k in keys}, "quantiles": [_number(q) for q in d.quantiles]}


def _class(cls: Any) -> dict[str, Any]:
    lengths = {"prompt_tokens": _dist(cls.prompt_tokens), "output_tokens": _dist(cls.output_tokens)}
    return {"name": cls.name, "weight": _number(cls.weight), "api": cls.api, **lengths}


def workload_yaml(fit: Fit) -> str:
    """The fitted workload as a Hydra workload file, its fidelity as a header comment."""
    wl = fit.workload
    data: dict[str, Any] = {
        "classes": [_class(cls) for cls in wl.classes],
        **{k: getattr(wl, k) for k in _WRITTEN},
        "prefix": asdict(wl.prefix),
    }
    span = f" over {fit.span_s:.0f} s" if fit.span_s else ""
    header = [f"Fitted by `tuner workload fit` from {fit.source}: {fit.requests} requests{span}."]
    header += ["Lengths: empirical quantiles at p = 0, 0.01, ..., 1 (edit them, or the rate)."]
    if len(wl.classes) > 1:
        header += ["Classes: weight = share of the requests; set each one's priority (and SLOs)."]
    header += fit.fidelity.lines()
    comment = "".join(f"# {line}\n" for line in header)
    return comment + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def fit_command(request: FitRequest, say: Callable[[str], None] = print) -> int:
    if request.trace is None and (request.class_by_prompt or request.class_column):
        raise ConfigError(
            f"{RULE_OPTION} and {COLUMN_OPTION} class a trace's requests: they need --from-trace",
            hint="a server's metrics hold no request classes",
        )
    if request.trace is not None:
        trace = read_trace(request.trace, request.layout, _class_by(request))
        options = TraceOptions(
            request.start_s, request.duration_s, request.rate_scale, request.max_model_len
        )
        trace = select(trace, options)
        for note in trace.notes:
            say(f"trace: {note}")
        fit = fit_trace(trace)
    else:
        if request.window_s <= 0:
            raise ConfigError(f"--window-s must be > 0, got {request.window_s:g}")
        fit = fit_metrics(str(request.metrics_url), request.window_s)
    try:
        request.out.parent.mkdir(parents=True, exist_ok=True)
        request.out.write_text(workload_yaml(fit), encoding="utf-8")
    except OSError as exc:
        raise ArtifactError(f"cannot write {request.out}: {exc}") from exc
    say(f"fitted {fit.requests} requests of {fit.source} -> {request.out}")
    for line in fit.fidelity.lines():
        say(f"  {line}")
    say("  use it: copy it to conf/workload/ and run with workload=<its name>")
    return 0
