"""The acceptance rule: keep a stage winner only if it beats the incumbent beyond the noise.

Single measurements on shared machines differ by 20-40 % between neighbouring configs (measured
on this project's machines), so a stage's best trial is re-measured interleaved with the
incumbent and the decision uses every measurement of both. The rule is simple to explain:

    gain      = mean(candidate) - mean(incumbent)          (sign-adjusted: larger is better)
    noise     = t(0.975, df) * sd * sqrt(1/n_c + 1/n_i) * |mean(incumbent)|
                (sd, df: the study's pooled relative noise, tuner.study.decision.noise;
                 study.noise=pair:
                 2 * sqrt(var_c / n_c + var_i / n_i), each comparison's own variances)
    threshold = max(noise, min_gain * |mean(incumbent)|)
    accept   <=> the candidate meets every constraint with the stated confidence
                 (tuner.scoring.confidence: its repeats bound each P99 under its SLO at
                 study.slo_confidence) and (gain > threshold or the incumbent does not meet
                 one so: feasibility first),
                 or neither does and the candidate misses them by less (its summed relative
                 overshoot at that confidence bound is smaller, none failed)

The last clause moves a search off an infeasible start: where knobs reach the SLOs only
together (a TTFT SLO met only at high TP, a TPOT SLO only at lower concurrency), no single
stage finds a feasible point from an infeasible incumbent, and keeping the incumbent would
stall every stage after it. Nothing infeasible is handed over as if it met the SLOs: the
summary says which constraint the final incumbent still misses.

Constraints are judged on every repeat together, not repeat by repeat: a P99 over a 10-20 s
window rests on its two or three slowest requests, so a configuration whose true P99 sits 10 %
under the SLO can miss it in any single window (the AVX2 landscape's P99 spread between repeats
is up to 45 %). Demanding every repeat would reject such a configuration
more often the more carefully it was measured. A failed repeat still disqualifies: its violation
is a 1e6 sentinel (tuner.scoring.objective.NO_DATA_VIOLATION) that no mean absorbs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tuner.scoring.confidence import SloClaim
from tuner.scoring.feasibility import NO_DATA_VIOLATION
from tuner.study.decision.noise import NoiseEstimate, NoiseSplit

# The F-test's level at which the baseline's launches count as differing beyond their windows.
SPLIT_P = 0.05


@dataclass(frozen=True)
class Comparison:
    """What the rule compares: a stage's winner against the incumbent, both re-measured.

    ``incumbent`` and ``candidate`` are the selection objective's values of each side;
    ``candidate_feasible`` and ``incumbent_feasible`` say each side meets every constraint with
    the study's confidence (:func:`tuner.scoring.confidence.confidently_met`); ``pooled`` is
    the study's noise (including these two sides' repeats), None for the pair rule;
    ``*_violation`` is each side's summed overshoot at that confidence bound (0 where met).
    """

    stage: str
    objective: str
    direction: str  # maximize | minimize
    incumbent: Sequence[float]
    candidate: Sequence[float]
    candidate_feasible: bool
    min_gain: float
    incumbent_feasible: bool = True
    pooled: NoiseEstimate | None = None
    incumbent_violation: float = 0.0
    candidate_violation: float = 0.0


@dataclass(frozen=True)
class ObjectiveChange:
    """An objective beside ``select_by``: the candidate's change over the incumbent on the
    confirmation's windows, and the smallest change those windows resolve.

    ``verdict`` is the acceptance rule asked both ways on that objective (its noise pooled over
    the two sides' windows, as `tuner compare` pools them): better, worse, within noise where
    the windows resolve ``check.resolve``, else unresolved: a stage that reports a P99 "within
    noise" of a noise three times the change asked about would say "no change" of what it
    could not see."""

    objective: str
    direction: str
    change: float  # candidate mean / incumbent mean - 1
    resolution: float  # nan while the noise is unknown
    verdict: str
    windows: tuple[int, int] = (0, 0)  # incumbent's, candidate's

    def text(self) -> str:
        seen = (
            f"resolves {self.resolution:.0%}" if math.isfinite(self.resolution) else "noise unknown"
        )
        return f"{self.objective} {self.change:+.1%} ({seen}: {self.verdict})"


def objective_changes(
    names: Sequence[str],
    directions: Sequence[str],
    incumbent: Sequence[Sequence[float]],
    candidate: Sequence[Sequence[float]],
    skip: str,
    min_gain: float,
    resolve: Callable[[str], float],
) -> list[ObjectiveChange]:
    """Every objective but ``skip`` over both sides' windows (one value vector per window)."""
    out = []
    for i, (name, direction) in enumerate(zip(names, directions, strict=False)):
        inc = [float(row[i]) for row in incumbent if math.isfinite(row[i]) and row[i] > 0]
        cand = [float(row[i]) for row in candidate if math.isfinite(row[i]) and row[i] > 0]
        if name == skip or not inc or not cand:
            continue
        noise = NoiseEstimate.of(inc, cand)
        resolution = noise.resolution(len(inc), len(cand))
        better = decide(Comparison("", name, direction, inc, cand, True, min_gain, True, noise))
        worse = decide(Comparison("", name, direction, cand, inc, True, min_gain, True, noise))
        verdict = "within noise" if resolution <= resolve(name) else "unresolved"
        if better.accepted or worse.accepted:  # a change seen is seen, resolved or not
            verdict = "better" if better.accepted else "worse"
        change = float(np.mean(cand) / np.mean(inc) - 1)
        shown = resolution if math.isfinite(resolution) else math.nan
        out.append(ObjectiveChange(name, direction, change, shown, verdict, (len(inc), len(cand))))
    return out


@dataclass(frozen=True)
class Decision:
    """A stored, printable acceptance decision."""

    stage: str
    objective: str
    direction: str
    accepted: bool
    reason: str
    incumbent_values: list[float] = field(default_factory=list)
    candidate_values: list[float] = field(default_factory=list)
    incumbent_mean: float = float("nan")
    candidate_mean: float = float("nan")
    gain: float = float("nan")
    noise: float = float("nan")
    noise_df: int | None = None  # the pooled estimate's degrees of freedom (None: pair rule)
    threshold: float = float("nan")
    # decided by the SLOs (one side meets them with confidence, or neither does), so the gain
    # and its threshold did not decide: the line says so instead of a threshold it ignored
    on_slos: bool = False
    candidate_trial: int | None = None
    candidate_params: dict[str, Any] = field(default_factory=dict)
    # every objective of the winner's search trial, and its constraints: the new incumbent's
    candidate_objectives: list[float] = field(default_factory=list)
    candidate_constraints: dict[str, float] = field(default_factory=dict)
    # the incumbent's constraints on the mean of its repeats (empty when it was not re-measured)
    incumbent_constraints: dict[str, float] = field(default_factory=dict)
    # the windows those two means are taken over, one constraint set per measurement
    candidate_constraint_windows: list[dict[str, float]] = field(default_factory=list)
    incumbent_constraint_windows: list[dict[str, float]] = field(default_factory=list)
    # a winner whose repeats missed the SLOs, passed over for the next trial that met them: its
    # trial and its constraints on the mean of its repeats (a lead for the next stages)
    passed_over_trial: int | None = None
    passed_over_constraints: dict[str, float] = field(default_factory=dict)
    # the other objectives on the confirmation's windows, each with what it can resolve
    others: list[ObjectiveChange] = field(default_factory=list)
    # each side's SLOs as claims with a stated confidence, on the windows above
    candidate_slos: list[SloClaim] = field(default_factory=list)
    incumbent_slos: list[SloClaim] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for side in ("candidate_slos", "incumbent_slos"):
            data[side] = [c.to_dict() for c in getattr(self, side)]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        known = set(cls.__dataclass_fields__)
        fields_ = {k: v for k, v in data.items() if k in known}
        fields_["others"] = [
            ObjectiveChange(**{**o, "windows": tuple(o.get("windows") or (0, 0))})
            for o in data.get("others") or []
        ]
        for side in ("candidate_slos", "incumbent_slos"):
            fields_[side] = [SloClaim.from_dict(c) for c in data.get(side) or []]
        return cls(**fields_)

    def line(self) -> str:
        """The decision in plain words: the change of the selection objective and the change
        the rule asked for (noise and study.min_gain), both in % of the incumbent; the windows
        and degrees of freedom behind them are in the stored decision and the report."""
        verdict = "ACCEPTED" if self.accepted else "kept the incumbent"
        if not self.candidate_values:
            return f"stage {self.stage}: {verdict} ({self.reason})"
        return (
            f"stage {self.stage}: {verdict}, {self.objective} {self.incumbent_mean:.4g} → "
            f"{self.candidate_mean:.4g} ({self._change()}) - {self.reason}{self._others()}"
        )

    def _change(self) -> str:
        base = abs(self.incumbent_mean)
        if not base or not math.isfinite(self.threshold):
            return f"gain {self.gain:+.4g}, needed > {self.threshold:.4g}"
        change = (self.candidate_mean - self.incumbent_mean) / base
        if self.on_slos:
            return f"{change:+.0%}; decided on the SLOs, not the gain"
        return f"{change:+.0%}; a gain must exceed {self.threshold / base:.0%} to count"

    def _others(self) -> str:
        return "; " + ", ".join(o.text() for o in self.others) if self.others else ""


def _sem2(values: np.ndarray) -> float:
    """Variance of the mean; 0 for a single value (its noise is unknown, min_gain still holds)."""
    if len(values) < 2:
        return 0.0
    with np.errstate(invalid="ignore"):  # a failed repeat's sentinel is infinite: noise is nan
        return float(np.var(values, ddof=1) / len(values))


def _two_se(sem2_a: float, sem2_b: float) -> float:
    """The rule's noise: two standard errors of a difference of two means."""
    return 2.0 * float(np.sqrt(sem2_a + sem2_b))


def decide(c: Comparison) -> Decision:
    """Apply the rule above.

    Feasibility comes first: an incumbent that violates a constraint (e.g. a baseline over the
    SLO) gives way to a feasible candidate, whatever the gain.
    """
    sign = 1.0 if c.direction == "maximize" else -1.0
    inc, cand = np.asarray(c.incumbent, float), np.asarray(c.candidate, float)
    head = Decision(c.stage, c.objective, c.direction, False, "", list(inc), list(cand))
    if len(inc) == 0 or len(cand) == 0:
        return replace(head, reason="no measurements to compare")
    inc_mean, cand_mean = float(inc.mean()), float(cand.mean())
    gain = sign * (cand_mean - inc_mean)
    if c.pooled is None:
        noise, df = _two_se(_sem2(inc), _sem2(cand)), None
    else:
        noise, df = c.pooled.threshold(len(inc), len(cand), inc_mean), c.pooled.df
    threshold = max(noise, c.min_gain * abs(inc_mean))
    accepted, reason = _verdict(c, gain, threshold)
    return replace(
        head,
        accepted=accepted,
        reason=reason,
        on_slos=not (c.candidate_feasible and c.incumbent_feasible),
        incumbent_mean=inc_mean,
        candidate_mean=cand_mean,
        gain=gain,
        noise=noise,
        noise_df=df,
        threshold=threshold,
    )


def _verdict(c: Comparison, gain: float, threshold: float) -> tuple[bool, str]:
    if not c.candidate_feasible:
        if not c.incumbent_feasible and _misses_by_less(c):
            return True, (
                f"neither meets every constraint; the candidate misses them by less "
                f"({c.candidate_violation:.1%} vs {c.incumbent_violation:.1%} summed overshoot)"
            )
        return (
            False,
            "candidate not shown to meet every SLO with the confidence asked, or it failed",
        )
    if not c.incumbent_feasible:
        return (
            True,
            "the incumbent does not meet every SLO with the confidence asked; the candidate does",
        )
    if not np.isfinite(gain):
        return False, "a re-measurement gave no value"
    if gain > threshold:
        return True, "gain exceeds the measured noise"
    return False, "gain within the measured noise"


def _misses_by_less(c: Comparison) -> bool:
    """A step toward feasibility: no failed repeat, and a smaller summed overshoot."""
    return c.candidate_violation < min(c.incumbent_violation, NO_DATA_VIOLATION)


def resolvable_gain(
    samples: Sequence[float],
    repeats: int,
    min_gain: float,
    pooled: bool = True,
    candidate_windows: int | None = None,
) -> float | None:
    """The smallest relative gain a stage can accept over an incumbent measured as ``samples``.

    The rule's threshold, relative to the incumbent's mean, when the candidate is as noisy as
    the incumbent: ``len(samples) + repeats`` incumbent measurements against
    ``candidate_windows`` of the candidate (default ``1 + repeats``: its search trial and its
    confirmations); the pooled rule's estimate then rests on those measurements (and grows more
    certain in later stages). None with fewer than two finite samples: one window says nothing
    about the noise.
    """
    x = np.asarray(samples, float)
    if len(x) < 2 or not np.all(np.isfinite(x)) or x.mean() == 0:
        return None
    n_inc = len(x) + repeats
    n_cand = 1 + repeats if candidate_windows is None else candidate_windows
    if pooled:  # the first stage's pool: both sides' repeats, at the baseline's spread
        est = NoiseEstimate(NoiseEstimate.of(list(x)).rel_sd, n_inc + n_cand - 2)
        noise = est.threshold(n_inc, n_cand, float(x.mean()))
    else:
        var = float(np.var(x, ddof=1))
        noise = _two_se(var / n_inc, var / n_cand)
    return max(noise / abs(float(x.mean())), min_gain)


def resolution_line(
    objective: str,
    samples: Sequence[float],
    repeats: int,
    min_gain: float,
    pooled: bool = True,
    candidate_windows: int | None = None,
    slices: Sequence[Sequence[float]] = (),
) -> str:
    """What the baseline's spread means for the study, said once before the stages start;
    with each window's token rate in slices (``Measurements.window_slices``), also which
    setting would narrow it (:func:`noise_advice`)."""
    gain = resolvable_gain(samples, repeats, min_gain, pooled, candidate_windows)
    if gain is None:
        return f"baseline {objective}: one window, its noise unknown until a stage re-measures it"
    x = np.asarray(samples, float)
    cv = float(np.std(x, ddof=1) / abs(x.mean()))
    return (
        f"baseline {objective}: {x.mean():.4g} over {len(x)} windows, CV {cv:.0%}: at this noise "
        f"a gain must exceed ~{gain:.0%} to count (each stage states its own, with the noise "
        f"of every configuration measured by then; "
        f"{noise_advice(NoiseSplit.of([s for s in slices if s]))})"
    )


def noise_advice(split: NoiseSplit | None) -> str:
    """Which setting narrows the noise: a longer window averages a window's own noise away,
    only more launches average away what differs between launches."""
    more = "study.baseline_measurements or study.repeats"
    if split is None:
        return f"for smaller ones raise workload.window_s, {more}"
    where = (
        f"token rate: {split.slices} slices of a window {split.slice_sd:.0%} apart, "
        f"launches {split.launch_sd:.0%} beyond that"
    )
    if split.p_launches_differ < SPLIT_P:
        return f"{where}; launches differ, so for smaller gains raise {more}, not the window"
    return f"{where}; for smaller gains raise workload.window_s (seconds, not launches) or {more}"
