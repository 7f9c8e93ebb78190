"""`tuner check`: is the running deployment still as good as the study said?

The post-release check a pipeline runs after each rollout step. It reads the ``evidence.json``
that `tuner export` wrote, runs that evidence's workload against the endpoint through the same
load generator and measurement as a trial (tuner/deployment/check/endpoint.py), starting nothing,
and judges each objective and SLO:

- an objective *regressed* when the study's acceptance threshold (tuner/study/decision/noise.py, the
  rule of tuner/study/decision/acceptance.py) on log(value) says the evidence is better than the
  deployment: the difference beats the study's pooled noise of that objective, with this
  check's own windows pooled in (``_deployment_side`` says why), and the study's ``min_gain``;
- every objective row states its *resolution*: the smallest change it would detect at the
  study's confidence with 80 % power (``NoiseEstimate.resolution``). A row that neither
  regressed nor improved and cannot resolve the evidence's ``check.resolve`` (20 % unless the
  study set it) reads UNRESOLVED with the windows it would need, never PASS: a PASS that could
  not have seen a doubled P99 would tell the user there is no regression;
- an SLO fails when the deployment misses it on the mean of its windows; its row also states
  its margin and how sure the check's own windows are that it is met (their spread, as the
  study judges a claim: tuner/scoring/confidence.py, at the confidence the evidence's study
  asked), so a pass on the edge of an SLO reads as one.

The check measures ``--windows`` windows, then more while an unresolved row could be resolved
within ``--max-windows``.

Exit codes: 0 every row passed, 1 a regression or a missed SLO, 2 bad input, 3 no failure but
some objective unresolved. The verdict table is printed; ``check.json`` and ``junit.xml`` (for
CI systems, an unresolved row as skipped) are written to ``--out``, with the API key and other
secrets redacted.
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
from tuner.config.study import StudyConfig
from tuner.deployment.check.endpoint import (
    Say,
    api_key_from,
    finite,
    measure_window,
    open_endpoint,
    pooled_with,
)
from tuner.deployment.check.evidence_file import Reference, read_reference, tokenizer_for
from tuner.deployment.junit import Case, junit_xml, write_text
from tuner.errors import ConfigError
from tuner.measurement.stats import Measurements
from tuner.redact import Redactor
from tuner.scoring.confidence import SloClaim, SloStatus, claims
from tuner.study.decision.noise import NoiseEstimate

PASS, BETTER, REGRESSION, UNRESOLVED = "pass", "better", "regression", "unresolved"
MET, VIOLATED = "met", "violated"
EXIT_PASS, EXIT_REGRESSION, EXIT_UNRESOLVED = 0, 1, 3
DEFAULT_SLO_TARGET = StudyConfig.slo_confidence  # evidence written before the study stated it


@dataclass(frozen=True)
class CheckOptions:
    url: str
    evidence: Path
    api_key_env: str | None = None
    windows: int = 3  # measured first
    out: Path = Path("tuner-check")
    wait_s: float = 30.0  # how long an endpoint may take to answer before it counts as down
    tokenizer: Path | None = None
    client_cpus: tuple[int, ...] | None = None
    max_windows: int = 12  # the budget: more windows only while they resolve a row
    resolve: float | None = None  # overrides the evidence's check.resolve for every objective


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
    resolution: float | None = None  # the smallest change this row detects (objectives)
    needs: int | None = None  # more windows that would resolve it (None: none would, here)
    margin: float | None = None  # an SLO's: how far under its limit the mean is (< 0: over)
    confidence: float | None = None  # an SLO's: how sure the windows are (None: no spread yet)

    @property
    def failed(self) -> bool:
        return self.verdict in (REGRESSION, VIOLATED)

    @property
    def unresolved(self) -> bool:
        return self.verdict == UNRESOLVED

    @property
    def label(self) -> str:
        if not self.unresolved:
            return self.verdict.upper()
        if self.needs is None:
            return "UNRESOLVED (more windows here cannot resolve it)"
        return f"UNRESOLVED (needs {self.needs} more windows)"


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

    @property
    def exit_code(self) -> int:
        if not self.passed:
            return EXIT_REGRESSION
        return EXIT_UNRESOLVED if any(r.unresolved for r in self.rows) else EXIT_PASS

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: PASS, EXIT_REGRESSION: "fail", EXIT_UNRESOLVED: UNRESOLVED}[
            self.exit_code
        ]

    def to_dict(self) -> dict[str, Any]:
        stamp = {"simulated": self.reference.simulated} if self.reference.simulated else {}
        return {
            **stamp,
            "verdict": self.verdict,
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
    resolve: float = 0.2,
) -> Row:
    """The acceptance threshold asked whether the evidence beats the deployment (a regression) or
    the deployment beats the evidence (better); neither is a pass only where the row resolves
    ``resolve``, else it is unresolved, with the windows that would resolve it."""
    dep = float(np.mean(measured)) if measured else math.nan
    if not reference:
        why = "no value in the evidence: export the study again"
        return Row("objective", name, None, dep, None, None, UNRESOLVED, why)
    ref = float(np.mean(reference))
    if not measured or not finite(measured):
        return Row("objective", name, ref, None, None, None, REGRESSION, "no value measured")
    side, pooled, noise = _deployment_side(measured, prior)

    # On log(value), where the noise is measured: the study's rule scales its threshold by the
    # deployment's mean, which past a noise of ~50 % allows any rise (a +255 % tail passed).
    h = max(pooled.threshold(len(reference), len(side), 1.0), math.log1p(min_gain))
    shift = math.log(dep / ref) * (1 if direction == "maximize" else -1)  # > 0: better
    worse, better = shift < -h, shift > h
    resolution = pooled.resolution(len(reference), len(side))
    needs = pooled.more_windows(len(reference), len(side), resolve)
    if pooled.df < 1 and len(side) == 1:  # a second window is what makes the noise known
        needs = 1
    verdict = PASS if resolution <= resolve else UNRESOLVED
    if worse or better:  # a change seen is seen, resolved or not
        verdict = REGRESSION if worse else BETTER
    detail = (
        f"{direction}; {len(reference)} evidence windows, {len(measured)} measured; {noise}; "
        f"resolves {_resolution_text(resolution)} (asked {_share(resolve)})"
    )
    if verdict == UNRESOLVED:
        detail += f"; {_needs_text(pooled, len(reference), len(side), resolve, needs)}"
    allowed = 1 - math.exp(-h) if direction == "maximize" else math.expm1(h)
    change = dep / ref - 1 if ref else None
    shown = None if math.isinf(resolution) else resolution
    return Row("objective", name, ref, dep, change, allowed, verdict, detail, shown, needs)


def _resolution_text(resolution: float) -> str:
    return "nothing (noise unknown)" if math.isinf(resolution) else _share(resolution)


def _share(value: float) -> str:
    return f"{value:.0%}" if value >= 0.01 else f"{value:.2%}"


def _needs_text(
    noise: NoiseEstimate, n_ref: int, n_dep: int, resolve: float, needs: int | None
) -> str:
    """What would resolve the row: more windows here, or more in the evidence too."""
    if noise.df < 1:
        return "noise unknown: measure at least 2 windows"
    if needs is not None:
        return f"needs {needs} more windows (--max-windows)"
    both = noise.more_windows(n_ref, n_dep, resolve, both=True)
    return (
        f"the evidence's {n_ref} windows cannot: needs {both} more on each side "
        "(export the study again to record more)"
    )


def _deployment_side(
    measured: Sequence[float], prior: NoiseEstimate
) -> tuple[list[float], NoiseEstimate, str]:
    """The deployment's values as the rule sees them, the noise, and how it was known.

    The check judges this running deployment as it is: a launch that came up slow is a slow
    deployment, not noise to forgive. So its windows are repeats of one configuration, as the
    study pools its own: each counts, and their spread joins the study's pooled noise (its
    degrees of freedom too), which a few study windows alone can get far too small. Without
    any noise known only min_gain judges."""
    own = NoiseEstimate.of(measured)
    pooled = pooled_with(prior, measured)
    if pooled.df == 0:
        return list(measured), pooled, "noise unknown: min_gain alone"
    text = f"noise {pooled.rel_sd:.1%} ({prior.df} study + {own.df} check df)"
    return list(measured), pooled, text


def verdict_rows(
    reference: Reference,
    windows: Sequence[Measurements],
    resolve: float | None = None,
    slo_target: float = DEFAULT_SLO_TARGET,
) -> list[Row]:
    """Every objective's and set SLO's row; ``resolve`` overrides the evidence's targets;
    ``slo_target`` is the confidence an SLO's claim is stated against."""
    rows = []
    scoring = reference.scoring
    values = [scoring.values(m) for m in windows]
    for name, direction in scoring.objectives.items():
        rows.append(
            objective_row(
                name,
                direction,
                reference.samples.get(name, []),
                [v[name] for v in values],
                reference.noise[name],
                reference.min_gain,
                resolve if resolve is not None else reference.resolve_of(name),
            )
        )
    # each window's own violations: the claim's spread is the check's windows' alone, since
    # the deployment is judged as it runs, not pooled with the study's configurations
    found = {c.name: c for c in claims([scoring.violations([m]) for m in windows], [], slo_target)}
    for name, violation in scoring.violations(windows).items():
        rows.append(slo_row(name, violation, len(windows), found.get(name)))
    return rows


def slo_row(name: str, violation: float, windows: int, claim: SloClaim | None) -> Row:
    """Met or violated on the mean of the windows (the verdict); the detail adds the margin
    and the confidence of ``claim``, the same windows judged as the study judges a claim."""
    verdict = MET if violation <= 0 else VIOLATED
    detail = f"mean over {windows} windows {violation:+.1%} of its limit (<= 0 met)"
    if claim is None:
        return Row("slo", name, None, violation, None, None, verdict, detail)
    margin = claim.margin if math.isfinite(claim.margin) else None
    detail += f"; margin {claim.margin:+.1%}, {_sure_text(claim)}"
    sure = claim.confidence
    return Row(
        "slo", name, None, violation, None, None, verdict, detail, margin=margin, confidence=sure
    )


def _sure_text(claim: SloClaim) -> str:
    """How sure the windows are that the SLO is met, and what that says at the confidence
    asked: a met verdict whose claim is UNDECIDED sits on the SLO's edge."""
    if claim.confidence is None:
        return "confidence unknown (these windows give no spread yet)"
    asked = f"{claim.confidence:.0%} sure it is met (asked {claim.target:.0%})"
    words = {
        SloStatus.MET: "met at that confidence",
        SloStatus.MISSED: "MISSED at that confidence",
        SloStatus.UNDECIDED: "UNDECIDED at that confidence (more windows decide it)",
    }
    return f"{asked}: {words[claim.status]}"


def evidence_slo_target(path: Path) -> float:
    """The confidence the study asked of its SLOs, from the evidence's ``slos`` block (0.9 in
    evidence written before the block was)."""
    try:
        block = json.loads(path.read_text(encoding="utf-8")).get("slos") or {}
        target = float(block.get("target", DEFAULT_SLO_TARGET))
    except (OSError, ValueError, TypeError, AttributeError):
        raise ConfigError(
            f"--evidence {path}: its slos block is not one a check can read"
        ) from None
    if not 0.5 < target < 1:
        raise ConfigError(f"--evidence {path}: slos.target must be in (0.5, 1), got {target}")
    return target


def check_options(options: CheckOptions) -> None:
    """Bad input as one ConfigError line, before anything is measured."""
    check_http_url(options.url, "--url")
    if options.windows < 1:
        raise ConfigError(f"--windows must be >= 1, got {options.windows}")
    if options.max_windows < 1:
        raise ConfigError(f"--max-windows must be >= 1, got {options.max_windows}")
    if options.windows > options.max_windows:
        raise ConfigError(
            f"--windows {options.windows} is more than --max-windows {options.max_windows}"
        )
    if options.resolve is not None and not 0 < options.resolve < 1:
        raise ConfigError(
            f"--resolve must be a fraction in (0, 1), got {options.resolve}",
            hint="e.g. --resolve 0.2: detect a 20 % change",
        )


def more_windows(rows: Sequence[Row], measured: int, budget: int) -> int:
    """How many more windows resolve every unresolved row that the budget can resolve (0 when
    none can: more windows would be spent without changing a verdict)."""
    within = [r.needs for r in rows if r.unresolved and r.needs and measured + r.needs <= budget]
    return max(within, default=0)


def run_check(options: CheckOptions, say: Say) -> CheckResult:
    """Measure the endpoint ``options.windows`` times, then while more windows (within
    ``options.max_windows``) would resolve a row, and judge it against the evidence."""
    check_options(options)
    reference = read_reference(options.evidence)
    target = evidence_slo_target(options.evidence)
    api_key = api_key_from(options.api_key_env)
    tokenizer = tokenizer_for(reference, options.tokenizer)
    endpoint = open_endpoint(options.url, api_key, reference.model_names, options.wait_s)
    started, wl = time.monotonic(), reference.workload
    windows: list[Measurements] = []
    planned, rows = options.windows, []
    while len(windows) < planned:
        i = len(windows)
        say(f"window {i + 1}/{planned}: warm-up {wl.warmup_s:g} s, window {wl.window_s:g} s")
        out = options.out / "windows" / str(i + 1)
        m = measure_window(endpoint, tokenizer, wl, reference.slo, out, options.client_cpus)
        say(f"window {i + 1}: {m.completed} requests, {m.output_throughput:.0f} output tok/s")
        windows.append(m)
        rows = verdict_rows(reference, windows, options.resolve, target)
        if len(windows) == planned and (more := more_windows(rows, planned, options.max_windows)):
            planned += more
            names = ", ".join(r.name for r in rows if r.unresolved)
            say(f"{names} unresolved: {more} more windows (--max-windows {options.max_windows})")
    return CheckResult(reference, endpoint.url, windows, rows, time.monotonic() - started)


def _pct(value: float | None, sign: str = "") -> str:
    return "" if value is None else f"{sign}{value:.1%}" if sign else f"{value:+.1%}"


def table(result: CheckResult) -> str:
    ref = result.reference
    lines = [ref.simulated] if ref.simulated else []
    lines += [
        f"tuner check of {result.url} against {ref.study}: {ref.choice}",
        f"  {'':<4}{'name':<26}{'evidence':>12}{'measured':>12}{'change':>9}{'allowed':>9}"
        f"{'resolves':>9}  verdict",
    ]
    for r in result.rows:
        worse = "-" if ref.scoring.objectives.get(r.name) == "maximize" else "+"
        measured = _pct(r.measured) if r.kind == "slo" else _num(r.measured)
        lines.append(
            f"  {r.kind[:3]:<4}{r.name:<26}{_num(r.reference):>12}{measured:>12}"
            f"{_pct(r.change):>9}{_pct(r.allowed, worse):>9}{_pct(r.resolution, '±'):>9}  "
            f"{r.label}"
        )
    # an SLO's margin and confidence: a MET on the mean of a few windows may be on its edge
    lines += [f"  slo {r.name}: {r.detail}" for r in result.rows if r.kind == "slo"]
    failed = [r.name for r in result.rows if r.failed]
    unresolved = [r.name for r in result.rows if r.unresolved]
    if failed:
        lines.append(f"verdict: FAIL: {', '.join(failed)}")
    elif unresolved:
        lines.append(f"verdict: UNRESOLVED: {', '.join(unresolved)} (no regression seen)")
    else:
        lines.append("verdict: PASS")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4g}"


def write_outputs(result: CheckResult, out: Path, redactor: Redactor) -> dict[str, str]:
    """check.json and junit.xml, redacted; returns their paths."""
    cases = [
        Case(f"{r.kind} {r.name}", f"{r.label}: {r.detail}", r.failed, r.unresolved)
        for r in result.rows
    ]
    suite = f"tuner check {result.reference.study}"
    report = junit_xml(suite, cases, result.seconds, redactor.text)
    data = json.dumps(result.to_dict(), indent=2, default=str)
    paths = {
        "json": write_text(out / "check.json", redactor.text(data) + "\n"),
        "junit": write_text(out / "junit.xml", report),
    }
    return {k: str(v) for k, v in paths.items()}


def check_command(options: CheckOptions, say: Say) -> int:
    """Run the check, print the table, write the reports; 0 pass, 1 regression, 3 unresolved."""
    api_key = api_key_from(options.api_key_env)
    redactor = Redactor([*Redactor.for_environment().secrets, *([api_key] if api_key else [])])
    result = run_check(options, say)
    result.paths = write_outputs(result, options.out, redactor)
    print(redactor.text(table(result)))
    print(f"reports: {result.paths['json']} {result.paths['junit']}")
    return result.exit_code
