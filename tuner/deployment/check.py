"""`tuner check`: is the running deployment still as good as the study said?

The post-release check a pipeline runs after each rollout step. It reads the ``evidence.json``
that `tuner export` wrote, runs that evidence's workload against the endpoint through the same
load generator and measurement as a trial (tuner/deployment/check_measure.py), starting nothing,
and judges each objective and SLO:

- an objective *regressed* when the study's acceptance rule (tuner/study/acceptance.py
  ``decide``) would accept the evidence's measurements as better than the deployment's: the
  difference beats the study's pooled noise of that objective and the study's ``min_gain``,
  the deployment counting as one launch (``_deployment_side`` says why);
- an SLO fails when the deployment misses it on the mean of its windows.

Exit codes: 0 every row passed, 1 a regression or a missed SLO, 2 bad input. The verdict table
is printed; ``check.json`` and ``junit.xml`` (for CI systems) are written to ``--out``, with
the API key and other secrets redacted.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config import check_http_url
from tuner.deployment.check_measure import (
    Say,
    api_key_from,
    finite,
    measure_window,
    open_endpoint,
    pooled_with,
)
from tuner.deployment.check_reference import Reference, read_reference, tokenizer_for
from tuner.deployment.junit import Case, junit_xml, write_text
from tuner.errors import ConfigError
from tuner.measurement import Measurements
from tuner.redact import Redactor
from tuner.study.acceptance import Comparison, decide
from tuner.study.noise import NoiseEstimate

PASS, BETTER, REGRESSION = "pass", "better", "regression"
MET, VIOLATED = "met", "violated"
EXIT_PASS, EXIT_REGRESSION = 0, 1


@dataclass(frozen=True)
class CheckOptions:
    url: str
    evidence: Path
    api_key_env: str | None = None
    windows: int = 3
    out: Path = Path("tuner-check")
    wait_s: float = 30.0  # how long an endpoint may take to answer before it counts as down
    tokenizer: Path | None = None
    client_cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Row:
    """One verdict: an objective against the evidence, or an SLO on the deployment."""

    kind: str  # objective | slo
    name: str
    reference: float | None  # the evidence's mean (objectives)
    measured: float | None  # the deployment's mean; for an SLO its mean relative violation
    change: float | None  # measured / reference - 1
    allowed: float | None  # the largest change in the worse direction that is not a regression
    verdict: str
    detail: str

    @property
    def failed(self) -> bool:
        return self.verdict in (REGRESSION, VIOLATED)


@dataclass
class CheckResult:
    reference: Reference
    url: str
    windows: list[Measurements]
    rows: list[Row]
    seconds: float
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(r.failed for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": PASS if self.passed else "fail",
            "url": self.url,
            "evidence": str(self.reference.path),
            "study": self.reference.study,
            "choice": self.reference.choice,
            "windows": len(self.windows),
            "seconds": round(self.seconds, 1),
            "rows": [asdict(r) for r in self.rows],
            "measurements": [_finite(m.flat()) for m in self.windows],
        }


def _finite(values: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


def objective_row(
    name: str,
    direction: str,
    reference: Sequence[float],
    measured: Sequence[float],
    prior: NoiseEstimate,
    min_gain: float,
) -> Row:
    """The acceptance rule asked whether the evidence beats the deployment (a regression) or
    the deployment beats the evidence (better); neither is a pass."""
    dep = float(np.mean(measured)) if measured else math.nan
    if not reference:
        return Row("objective", name, None, dep, None, None, PASS, "no value in the evidence")
    ref = float(np.mean(reference))
    if not measured or not finite(measured):
        return Row("objective", name, ref, None, None, None, REGRESSION, "no value measured")
    side, pooled, noise = _deployment_side(measured, prior)

    def beats(better: Sequence[float], worse: Sequence[float]) -> Any:
        return decide(Comparison("check", name, direction, worse, better, True, min_gain, True,
                                 pooled))  # fmt: skip

    worse, better = beats(reference, side), beats(side, reference)
    verdict = REGRESSION if worse.accepted else BETTER if better.accepted else PASS
    detail = f"{direction}; {len(reference)} evidence windows, {len(measured)} measured; {noise}"
    allowed = _allowed(direction, pooled.threshold(len(reference), len(side), 1.0), min_gain)
    return Row("objective", name, ref, dep, dep / ref - 1 if ref else None, allowed, verdict,
               detail)  # fmt: skip


def _allowed(direction: str, noise: float, min_gain: float) -> float | None:
    """The largest change from the evidence, in the worse direction, that is not a regression.

    The rule scales its threshold ``h`` by the deployment's own mean: a regression is
    ``evidence - deployment > h * deployment``, a drop beyond h/(1+h) of the evidence (a rise
    beyond h/(1-h) for an objective to minimise; with h >= 1 no rise is beyond the noise)."""
    h = max(noise, min_gain)
    if direction == "maximize":
        return h / (1 + h)
    return h / (1 - h) if h < 1 else None


def _deployment_side(
    measured: Sequence[float], prior: NoiseEstimate
) -> tuple[list[float], NoiseEstimate, str]:
    """The deployment's values as the rule sees them, the noise, and how it was known.

    The study's windows each came from a launch of their own, so its noise holds what differs
    between launches; the deployment is one launch, and its windows cannot average that part
    away. So it counts as one measurement (the mean of its windows) against the study's noise:
    conservative, since its window-to-window part does shrink. Without a study noise (nothing
    was measured twice) only this check's own windows say anything: pooled, and said so."""
    if prior.df > 0:
        return [float(np.mean(measured))], prior, f"study noise {prior.rel_sd:.1%} ({prior.df} df)"
    own = pooled_with(prior, measured)
    if own.df == 0:
        return list(measured), own, "noise unknown: min_gain alone"
    return list(measured), own, f"noise of this check's windows only {own.rel_sd:.1%}"


def verdict_rows(reference: Reference, windows: Sequence[Measurements]) -> list[Row]:
    rows = []
    scoring = reference.scoring
    values = [scoring.values(m) for m in windows]
    for name, direction in scoring.objectives.items():
        rows.append(
            objective_row(name, direction, reference.samples.get(name, []),
                          [v[name] for v in values], reference.noise[name], reference.min_gain)
        )  # fmt: skip
    for name, violation in scoring.violations(windows).items():
        verdict = MET if violation <= 0 else VIOLATED
        detail = f"mean over {len(windows)} windows {violation:+.1%} of its limit (<= 0 met)"
        rows.append(Row("slo", name, None, violation, None, None, verdict, detail))
    return rows


def run_check(options: CheckOptions, say: Say) -> CheckResult:
    """Measure the endpoint ``options.windows`` times and judge it against the evidence."""
    check_http_url(options.url, "--url")
    if options.windows < 1:
        raise ConfigError(f"--windows must be >= 1, got {options.windows}")
    reference = read_reference(options.evidence)
    api_key = api_key_from(options.api_key_env)
    tokenizer = tokenizer_for(reference, options.tokenizer)
    endpoint = open_endpoint(options.url, api_key, reference.model_names, options.wait_s)
    started, wl = time.monotonic(), reference.workload
    windows = []
    for i in range(options.windows):
        say(
            f"window {i + 1}/{options.windows}: warm-up {wl.warmup_s:g} s, window {wl.window_s:g} s"
        )
        out = options.out / "windows" / str(i + 1)
        m = measure_window(endpoint, tokenizer, wl, reference.slo, out, options.client_cpus)
        say(f"window {i + 1}: {m.completed} requests, {m.output_throughput:.0f} output tok/s")
        windows.append(m)
    return CheckResult(reference, endpoint.url, windows, verdict_rows(reference, windows),
                       time.monotonic() - started)  # fmt: skip


def _pct(value: float | None, sign: str = "") -> str:
    return "" if value is None else f"{sign}{value:.1%}" if sign else f"{value:+.1%}"


def table(result: CheckResult) -> str:
    ref = result.reference
    lines = [
        f"tuner check of {result.url} against {ref.study}: {ref.choice}",
        f"  {'':<4}{'name':<26}{'evidence':>12}{'measured':>12}{'change':>9}{'allowed':>9}  "
        "verdict",
    ]
    for r in result.rows:
        worse = "-" if ref.scoring.objectives.get(r.name) == "maximize" else "+"
        measured = _pct(r.measured) if r.kind == "slo" else _num(r.measured)
        lines.append(
            f"  {r.kind[:3]:<4}{r.name:<26}{_num(r.reference):>12}{measured:>12}"
            f"{_pct(r.change):>9}{_pct(r.allowed, worse):>9}  {r.verdict.upper()}"
        )
    failed = [r.name for r in result.rows if r.failed]
    lines.append(f"verdict: {'FAIL: ' + ', '.join(failed) if failed else 'PASS'}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4g}"


def write_outputs(result: CheckResult, out: Path, redactor: Redactor) -> dict[str, str]:
    """check.json and junit.xml, redacted; returns their paths."""
    cases = [Case(f"{r.kind} {r.name}", f"{r.verdict}: {r.detail}", r.failed) for r in result.rows]
    suite = f"tuner check {result.reference.study}"
    report = junit_xml(suite, cases, result.seconds, redactor.text)
    data = json.dumps(result.to_dict(), indent=2, default=str)
    paths = {
        "json": write_text(out / "check.json", redactor.text(data) + "\n"),
        "junit": write_text(out / "junit.xml", report),
    }
    return {k: str(v) for k, v in paths.items()}


def check_command(options: CheckOptions, say: Say) -> int:
    """Run the check, print the table, write the reports; 0 pass, 1 regression."""
    api_key = api_key_from(options.api_key_env)
    redactor = Redactor([*Redactor.for_environment().secrets, *([api_key] if api_key else [])])
    result = run_check(options, say)
    result.paths = write_outputs(result, options.out, redactor)
    print(redactor.text(table(result)))
    print(f"reports: {result.paths['json']} {result.paths['junit']}")
    return EXIT_PASS if result.passed else EXIT_REGRESSION
