"""`tuner compare`: two running endpoints, the same workload, interleaved: is B better than A?

The windows alternate A B B A A B B A ... so that a drift of the machine (a neighbour, a
throttled core) falls on both sides alike. For each objective it reports B's mean over A's with a
95 % interval (B/A times and divided by 1 + the rule's threshold: Student's t at the noise
pooled over both sides' log values, as the study pools it) and a decision by the acceptance rule
(tuner/study/acceptance.py ``decide``): *B better* when the rule accepts B over A, *B worse* when
it accepts A over B, else *within noise*. Exit 0, or 1 when B is worse on some objective.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config import TunerConfig, check_http_url
from tuner.deployment.check_measure import (
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
from tuner.measurement import Measurements
from tuner.redact import Redactor
from tuner.scoring.objective import ObjectiveContext
from tuner.study.acceptance import Comparison, decide
from tuner.study.noise import NoiseEstimate


class Verdict(StrEnum):
    """What the rule says of B against A on one objective."""

    BETTER = "B better"
    WORSE = "B worse"
    SAME = "within noise"


BETTER, WORSE, SAME = Verdict.BETTER, Verdict.WORSE, Verdict.SAME


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


def window_order(windows: int) -> list[str]:
    """``A B B A A B B A ...``: ``windows`` of each side, alternating which goes first."""
    return [side for i in range(windows) for side in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def ratio_of(
    name: str, direction: str, a: Sequence[float], b: Sequence[float], min_gain: float
) -> Ratio:
    """B over A for one objective (both sides' values, one per window)."""
    if not (a and b and finite([*a, *b])) or min(*a, *b) <= 0:
        nan = math.nan
        return Ratio(name, direction, _mean(a), _mean(b), nan, nan, nan, SAME, nan, 0)
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

    decision = BETTER if accepts(a, b) else WORSE if accepts(b, a) else SAME
    return Ratio(name, direction, _mean(a), _mean(b), ratio, low, high, decision, pooled.rel_sd,
                 pooled.df)  # fmt: skip


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

    @property
    def worse(self) -> bool:
        return any(r.decision == WORSE for r in self.ratios)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.url_a,
            "b": self.url_b,
            "order": "".join(self.sides),
            "seconds": round(self.seconds, 1),
            "objectives": [_plain(asdict(r)) for r in self.ratios],
        }


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def scoring_of(config: TunerConfig) -> Scoring:
    from tuner.scoring.objective import get_objective

    names = list(dict.fromkeys([*config.objectives.names, config.objectives.select_by]))
    context = ObjectiveContext(cost=config.cost, slo=config.slo, device=config.server.device)
    return Scoring({n: get_objective(n).direction for n in names}, [], context)


def run_compare(config: TunerConfig, options: CompareOptions, say: Say) -> CompareResult:
    for url, option in ((options.url_a, "--url-a"), (options.url_b, "--url-b")):
        check_http_url(url, option)
    if options.windows < 2:
        raise ConfigError(f"--windows must be >= 2 (per side), got {options.windows}")
    key_a = api_key_from(options.api_key_env)
    key_b = api_key_from(options.api_key_env_b, "--api-key-env-b") or key_a
    names = [config.server.served_model_name or "", config.server.model]
    endpoints = {
        "A": open_endpoint(options.url_a, key_a, names, options.wait_s, "--url-a"),
        "B": open_endpoint(options.url_b, key_b, names, options.wait_s, "--url-b"),
    }
    started, sides = time.monotonic(), window_order(options.windows)
    windows = []
    for i, side in enumerate(sides):
        say(f"window {i + 1}/{len(sides)}: {side} ({endpoints[side].url})")
        windows.append(_window(config, endpoints[side], options, i))
        say(f"window {i + 1}: {windows[-1].output_throughput:.0f} output tok/s")
    scoring = scoring_of(config)
    values = [scoring.values(m) for m in windows]
    ratios = [
        ratio_of(n, d, [v[n] for v, s in zip(values, sides, strict=True) if s == "A"],
                 [v[n] for v, s in zip(values, sides, strict=True) if s == "B"],
                 config.study.min_gain)
        for n, d in scoring.objectives.items()
    ]  # fmt: skip
    return CompareResult(endpoints["A"].url, endpoints["B"].url, sides, windows, ratios,
                         time.monotonic() - started)  # fmt: skip


def _window(config: TunerConfig, endpoint: Endpoint, options: CompareOptions, i: int) -> Any:
    out = options.out / "windows" / f"{i + 1}"
    return measure_window(
        endpoint, config.server.model, config.workload, config.slo, out, options.client_cpus
    )


def table(result: CompareResult) -> str:
    lines = [
        f"tuner compare: A {result.url_a}, B {result.url_b}, windows {''.join(result.sides)}",
        f"  {'objective':<26}{'A':>11}{'B':>11}{'B/A':>8}  {'95% CI':<15} decision",
    ]
    for r in result.ratios:
        ci = f"{r.low:.3f}-{r.high:.3f}" if math.isfinite(r.low) else ""
        lines.append(
            f"  {r.objective:<26}{r.mean_a:>11.4g}{r.mean_b:>11.4g}{r.ratio:>8.3f}  {ci:<15} "
            f"{r.decision}"
        )
    return "\n".join(lines)


def compare_command(config: TunerConfig, options: CompareOptions, say: Say) -> int:
    """Run the comparison, print the table, write compare.json and junit.xml."""
    keys = [api_key_from(options.api_key_env), api_key_from(options.api_key_env_b)]
    redactor = Redactor([*Redactor.for_environment().secrets, *[k for k in keys if k]])
    result = run_compare(config, options, say)
    cases = [
        Case(r.objective, f"{r.decision}: B/A {r.ratio:.3f}", r.decision == WORSE)
        for r in result.ratios
    ]
    data = json.dumps(result.to_dict(), indent=2)
    json_path = write_text(options.out / "compare.json", redactor.text(data) + "\n")
    junit = junit_xml("tuner compare", cases, result.seconds, redactor.text)
    junit_path = write_text(options.out / "junit.xml", junit)
    print(redactor.text(table(result)))
    print(f"reports: {json_path} {junit_path}")
    return 1 if result.worse else 0
