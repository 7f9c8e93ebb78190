"""`tuner compare`: two running endpoints, the same workload, interleaved: is B better than A?

The windows alternate A B B A A B B A ... so that a drift of the machine (a neighbour, a
throttled core) falls on both sides alike. For each objective it reports B's mean over A's with a
95 % interval (B/A times and divided by 1 + the rule's threshold: Student's t at the noise
pooled over both sides' log values, as the study pools it) and a decision by the acceptance rule
(tuner/study/decision/acceptance.py ``decide``): *B better* when the rule accepts B over A,
*B worse* when it accepts A over B, else *within noise* where the comparison resolves the
objective's ``check.resolve`` (the smallest change it would detect at the study's confidence
with 80 % power, ``NoiseEstimate.resolution``), and *unresolved* where it cannot: "within
noise" of a noise wider than the change asked about would read as "the same" when it means
"not seen".
After ``--windows`` rounds, more rounds are measured while they would resolve an objective
within ``--max-windows``. Exit 0; 1 when B is worse on some objective; 3 when nothing is
worse but some objective is unresolved.

A workload of several request classes gets the same rows per class (each class's P99 TTFT,
TPOT and E2E and its output tok/s, from its own requests of each window), by the same rule: B
may win on the totals by costing one class its tail, and a class that B makes worse exits 1.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config import TunerConfig, check_http_url
from tuner.deployment.check.endpoint import (
    Endpoint,
    Say,
    Scoring,
    api_key_from,
    finite,
    measure_window,
    open_endpoint,
)
from tuner.deployment.junit import Case, junit_xml, write_text
from tuner.errors import ConfigError
from tuner.measurement.stats import ClassStats, Measurements
from tuner.redact import Redactor
from tuner.scoring.objective import ObjectiveContext
from tuner.search.checks import devices_needed
from tuner.study.decision.acceptance import Comparison, decide
from tuner.study.decision.noise import NoiseEstimate


class Verdict(StrEnum):
    """What the rule says of B against A on one objective."""

    BETTER = "B better"
    WORSE = "B worse"
    SAME = "within noise"
    UNRESOLVED = "unresolved"


BETTER, WORSE, SAME = Verdict.BETTER, Verdict.WORSE, Verdict.SAME
UNRESOLVED = Verdict.UNRESOLVED
# What a class's row compares: (name, direction, the value of one window's class stats)
CLASS_METRICS: tuple[tuple[str, str, Callable[[ClassStats], float | None]], ...] = (
    ("p99_ttft", "minimize", lambda c: c.ttft.p99),
    ("p99_tpot", "minimize", lambda c: c.tpot.p99),
    ("p99_e2e", "minimize", lambda c: c.e2e.p99),
    ("output_throughput", "maximize", lambda c: c.output_throughput),
)


@dataclass(frozen=True)
class CompareOptions:
    url_a: str
    url_b: str
    api_key_env: str | None = None
    api_key_env_b: str | None = None  # when B has a key of its own
    windows: int = 4  # per side
    out: Path = Path("tuner-compare")
    wait_s: float = 30.0
    client_cpus: tuple[int, ...] | None = None
    max_windows: int = 12  # per side, the budget for resolving check.resolve


@dataclass(frozen=True)
class Ratio:
    """One objective: B's mean over A's, its confidence interval, and the rule's decision."""

    objective: str
    direction: str
    mean_a: float
    mean_b: float
    ratio: float
    low: float
    high: float
    decision: Verdict
    noise_rel_sd: float
    noise_df: int
    resolution: float = math.inf  # the smallest change of B against A this detects
    needs: int | None = None  # more rounds (one window of each side) that would resolve it

    @property
    def label(self) -> str:
        if self.decision != UNRESOLVED:
            return str(self.decision)
        if self.needs is None:  # a known noise too wide for any number of windows, or none
            if math.isfinite(self.resolution):
                return "unresolved (more windows cannot resolve it)"
            return "unresolved (noise unknown)"
        return f"unresolved (needs {self.needs} more windows of each)"


def window_order(windows: int) -> list[str]:
    """``A B B A A B B A ...``: ``windows`` of each side, alternating which goes first."""
    return [side for i in range(windows) for side in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def ratio_of(
    name: str,
    direction: str,
    a: Sequence[float],
    b: Sequence[float],
    min_gain: float,
    resolve: float = 0.2,
) -> Ratio:
    """B over A for one objective (both sides' values, one per window)."""
    if not (a and b and finite([*a, *b])) or min(*a, *b) <= 0:
        nan = math.nan
        return Ratio(name, direction, _mean(a), _mean(b), nan, nan, nan, UNRESOLVED, nan, 0)
    pooled = NoiseEstimate.of(a, b)
    ratio = _mean(b) / _mean(a)
    # The rule's threshold as a factor: B is better when B/A > 1 + h, worse when B/A < 1/(1 + h)
    # (min_gain aside), so this interval leaves out 1 exactly when the rule decides.
    factor = 1 + pooled.threshold(len(a), len(b), 1.0)
    low, high = ratio / factor, ratio * factor

    def accepts(incumbent: Sequence[float], candidate: Sequence[float]) -> bool:
        comparison = Comparison(
            "compare", name, direction, incumbent, candidate, True, min_gain, True, pooled
        )
        return decide(comparison).accepted

    resolution = pooled.resolution(len(a), len(b))
    decision = SAME if resolution <= resolve else UNRESOLVED
    if accepts(a, b) or accepts(b, a):  # a change seen is seen, resolved or not
        decision = BETTER if accepts(a, b) else WORSE
    needs = pooled.more_windows(len(a), len(b), resolve, both=True)
    means = (_mean(a), _mean(b))
    return Ratio(
        name,
        direction,
        *means,
        ratio,
        low,
        high,
        decision,
        pooled.rel_sd,
        pooled.df,
        resolution,
        needs,
    )


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else math.nan


@dataclass
class CompareResult:
    url_a: str
    url_b: str
    sides: list[str]  # the order the windows ran in
    windows: list[Measurements]
    ratios: list[Ratio]
    seconds: float
    # request class -> its rows (CLASS_METRICS); empty for a workload of one class
    classes: dict[str, list[Ratio]] = field(default_factory=dict)

    @property
    def worse(self) -> bool:
        rows = [*self.ratios, *(r for rows in self.classes.values() for r in rows)]
        return any(r.decision == WORSE for r in rows)

    @property
    def exit_code(self) -> int:
        if self.worse:
            return 1
        return 3 if any(r.decision == UNRESOLVED for r in self.ratios) else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.url_a,
            "b": self.url_b,
            "order": "".join(self.sides),
            "seconds": round(self.seconds, 1),
            "objectives": [_plain(asdict(r)) for r in self.ratios],
            "classes": {
                name: [_plain(asdict(r)) for r in rows] for name, rows in self.classes.items()
            },
        }


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def scoring_of(config: TunerConfig) -> Scoring:
    from tuner.scoring.objective import get_objective

    names = list(dict.fromkeys([*config.objectives.names, config.objectives.select_by]))
    context = ObjectiveContext(
        cost=config.cost,
        slo=config.slo,
        device=config.server.device,
        gpus_used=devices_needed(config.server.args),  # a GPU endpoint's cost: its GPUs
    )
    return Scoring({n: get_objective(n).direction for n in names}, [], context)


def run_compare(config: TunerConfig, options: CompareOptions, say: Say) -> CompareResult:
    for url, option in ((options.url_a, "--url-a"), (options.url_b, "--url-b")):
        check_http_url(url, option)
    if options.windows < 2:
        raise ConfigError(f"--windows must be >= 2 (per side), got {options.windows}")
    if options.max_windows < 1:
        raise ConfigError(f"--max-windows must be >= 1, got {options.max_windows}")
    key_a = api_key_from(options.api_key_env)
    key_b = api_key_from(options.api_key_env_b, "--api-key-env-b") or key_a
    names = [config.server.served_model_name or "", config.server.model]
    endpoints = {
        "A": open_endpoint(options.url_a, key_a, names, options.wait_s, "--url-a"),
        "B": open_endpoint(options.url_b, key_b, names, options.wait_s, "--url-b"),
    }
    started, planned = time.monotonic(), options.windows
    sides: list[str] = []
    windows: list[Measurements] = []
    ratios: list[Ratio] = []
    while len(sides) < 2 * planned:
        side = window_order(planned)[len(sides)]
        say(f"window {len(sides) + 1}/{2 * planned}: {side} ({endpoints[side].url})")
        windows.append(_window(config, endpoints[side], options, len(sides)))
        sides.append(side)
        say(f"window {len(sides)}: {windows[-1].output_throughput:.0f} output tok/s")
        if len(sides) == 2 * planned:
            ratios = _ratios(config, sides, windows)
            more = more_rounds(ratios, planned, options.max_windows)
            if more:
                open_ = ", ".join(r.objective for r in ratios if r.decision == UNRESOLVED)
                say(f"{open_} unresolved: {more} more windows of each side")
                planned += more
    seconds = time.monotonic() - started
    urls = (endpoints["A"].url, endpoints["B"].url)
    classes = class_ratios(config, sides, windows)
    return CompareResult(*urls, sides, windows, ratios, seconds, classes)


def _ratios(
    config: TunerConfig, sides: Sequence[str], windows: Sequence[Measurements]
) -> list[Ratio]:
    scoring = scoring_of(config)
    values = [scoring.values(m) for m in windows]

    def side(name: str, which: str) -> list[float]:
        return [v[name] for v, s in zip(values, sides, strict=True) if s == which]

    return [
        ratio_of(n, d, side(n, "A"), side(n, "B"), config.study.min_gain, config.check.target(n))
        for n, d in scoring.objectives.items()
    ]


def class_ratios(
    config: TunerConfig, sides: Sequence[str], windows: Sequence[Measurements]
) -> dict[str, list[Ratio]]:
    """Each request class's rows, where the workload has several (a class absent from a window,
    or with no such latency, leaves its row unresolved: nothing to compare)."""
    names = [rc.name for rc in config.workload.classes]
    if len(names) < 2:
        return {}

    def side(name: str, value: Callable[[ClassStats], float | None], which: str) -> list[float]:
        stats = [m.by_class.get(name) for m, s in zip(windows, sides, strict=True) if s == which]
        found = [value(c) if c is not None else None for c in stats]
        return [math.nan if v is None else float(v) for v in found]

    min_gain = config.study.min_gain
    return {
        name: [
            ratio_of(
                metric, d, side(name, v, "A"), side(name, v, "B"), min_gain, config.check.resolve
            )
            for metric, d, v in CLASS_METRICS
        ]
        for name in names
    }


def more_rounds(ratios: Sequence[Ratio], per_side: int, budget: int) -> int:
    """More windows of each side that resolve every unresolved objective the budget can."""
    within = [
        r.needs
        for r in ratios
        if r.decision == UNRESOLVED and r.needs and per_side + r.needs <= budget
    ]
    return max(within, default=0)


def _window(config: TunerConfig, endpoint: Endpoint, options: CompareOptions, i: int) -> Any:
    out = options.out / "windows" / f"{i + 1}"
    return measure_window(
        endpoint, config.server.model, config.workload, config.slo, out, options.client_cpus
    )


def table(result: CompareResult) -> str:
    lines = [
        f"tuner compare: A {result.url_a}, B {result.url_b}, windows {''.join(result.sides)}",
        f"  {'objective':<26}{'A':>11}{'B':>11}{'B/A':>8}  {'95% CI':<15}{'resolves':>9}  decision",
    ]
    lines += [_table_row(r.objective, r) for r in result.ratios]
    for name, rows in result.classes.items():
        lines += [_table_row(f"{name}: {r.objective}", r) for r in rows]
    return "\n".join(lines)


def _table_row(label: str, r: Ratio) -> str:
    ci = f"{r.low:.3f}-{r.high:.3f}" if math.isfinite(r.low) else ""
    res = f"±{r.resolution:.0%}" if math.isfinite(r.resolution) else ""
    return (
        f"  {label:<26}{r.mean_a:>11.4g}{r.mean_b:>11.4g}{r.ratio:>8.3f}  {ci:<15}"
        f"{res:>9}  {r.label}"
    )


def _case(name: str, r: Ratio) -> Case:
    resolves = f"{r.resolution:.0%}" if math.isfinite(r.resolution) else "nothing (noise unknown)"
    text = f"{r.label}: B/A {r.ratio:.3f}, resolves {resolves}"
    return Case(name, text, r.decision == WORSE, r.decision == UNRESOLVED)


def compare_command(config: TunerConfig, options: CompareOptions, say: Say) -> int:
    """Run the comparison, print the table, write compare.json and junit.xml."""
    keys = [api_key_from(options.api_key_env), api_key_from(options.api_key_env_b)]
    redactor = Redactor([*Redactor.for_environment().secrets, *[k for k in keys if k]])
    result = run_compare(config, options, say)
    cases = [_case(r.objective, r) for r in result.ratios]
    cases += [_case(f"{n}: {r.objective}", r) for n, rows in result.classes.items() for r in rows]
    data = json.dumps(result.to_dict(), indent=2)
    json_path = write_text(options.out / "compare.json", redactor.text(data) + "\n")
    junit = junit_xml("tuner compare", cases, result.seconds, redactor.text)
    junit_path = write_text(options.out / "junit.xml", junit)
    print(redactor.text(table(result)))
    print(f"reports: {json_path} {junit_path}")
    return result.exit_code
