"""The search for the highest arrival rate that still meets the SLOs: a coarse sweep, then
bisection. Pure logic: each rate is measured by a function given to it.

The sweep doubles the rate from a start while the SLOs hold (or halves it while they do not)
until it has a rate that meets them and one that does not; bisection then narrows that bracket
to ``resolution`` of its lower end. The answer is the bracket: the capacity lies in
``[max_rps, upper_rps)``, and its width is the stated uncertainty. Its lower end is then measured
once more: a second window that misses the SLOs there lowers the bracket (and the search goes on
below it), so one lucky window does not make the capacity. A rate that met the SLOs above one
that missed them is not believed: the bracket is always the lowest miss and the highest pass
below it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.config import SloConfig
from tuner.measurement.stats import Measurements
from tuner.plan.sizing import CapacityStep
from tuner.study.loop.budget import duration

Progress = Callable[[str], None]
MeasureRate = Callable[[float, str], CapacityStep]  # (rate, phase) -> its step
SWEEP_FACTOR = 2.0
MIN_FRACTION = 1 / 64  # halving below start x this: nothing meets the SLOs
# A load generator that did not keep its schedule did not offer the rate: its requests went out
# late (P99 of sent minus scheduled) or far too few were sent. Poisson arrivals alone vary the
# count in a 15 s window by +-25 % at 3 req/s, so the count is only a gross check.
LAG_LIMIT_S = 0.5
SENT_FRACTION = 0.5


def verdict(m: Measurements, slo: SloConfig, offered_rps: float, phase: str) -> CapacityStep:
    """One rate's measurement against the SLOs: every set P99, the error rate, and whether
    the load generator really offered the rate (a lagging client would flatter the server)."""
    sent = m.requests_started / m.window_s if m.window_s > 0 else 0.0
    p99 = {"ttft": m.ttft.p99, "tpot": m.tpot.p99, "e2e": m.e2e.p99}
    limits = {"ttft": slo.p99_ttft_s, "tpot": slo.p99_tpot_s, "e2e": slo.p99_e2e_s}
    missed = []
    for name, limit in limits.items():
        value = p99[name]
        if limit > 0 and (value is None or value > limit):
            shown = "no data" if value is None else f"{value:.3g} s"
            missed.append(f"P99 {name.upper()} {shown} > {limit:g} s")
    if m.error_rate > slo.max_error_rate:
        missed.append(f"error rate {m.error_rate:.1%} > {slo.max_error_rate:.1%}")
    lag = m.dispatch_lag_p99_s or 0.0
    if lag > LAG_LIMIT_S or sent < SENT_FRACTION * offered_rps:
        missed.append(f"the load generator sent only {sent:.3g} req/s, P99 {lag:.2g} s late")
    return CapacityStep(
        offered_rps=offered_rps,
        sent_rps=sent,
        goodput_rps=m.goodput,
        throughput_rps=m.request_throughput,
        error_rate=m.error_rate,
        p99_s=p99,
        meets=not missed,
        why="; ".join(missed),
        phase=phase,
    )


@dataclass
class SweepResult:
    max_rps: float  # highest rate that met the SLOs (0: none did)
    upper_rps: float  # lowest rate that missed them (inf: none did)
    steps: list[CapacityStep] = field(default_factory=list)
    confirmed: bool = False  # a second window at max_rps met the SLOs too


class CapacitySearch:
    """Coarse sweep, then bisection, within ``max_steps`` measured rates."""

    def __init__(
        self,
        measure: MeasureRate,
        start_rps: float,
        max_steps: int = 10,
        resolution: float = 0.1,
        progress: Progress = lambda _m: None,
    ) -> None:
        self.measure = measure
        self.start_rps = start_rps
        self.max_steps = max_steps
        self.resolution = resolution
        self.say = progress
        self.steps: list[CapacityStep] = []
        self.lo, self.hi = 0.0, math.inf
        self._rates: list[float] = []  # the rate of each step, as asked
        self._confirming = True  # a confirmation of the bracket's lower end is still to come
        self._spent_s = 0.0

    def run(self) -> SweepResult:
        self._sweep(self.start_rps)
        self._bisect()
        confirmed = False
        if self._room() and self.lo > 0:
            self._confirming = False
            confirmed = self._take(self.lo, "confirm").meets
            if not confirmed:  # the bracket moved down: find and narrow it again
                self._sweep(self.hi / SWEEP_FACTOR)
                self._bisect()
        return SweepResult(self.lo, self.hi, list(self.steps), confirmed)

    def _sweep(self, rate: float) -> None:
        """Double while the SLOs hold, halve while they do not, until bracketed; below a
        trickle of the start rate nothing meets them."""
        while self._room() and not self._bracketed() and rate >= self.start_rps * MIN_FRACTION:
            step = self._take(rate, "sweep")
            rate = rate * SWEEP_FACTOR if step.meets else rate / SWEEP_FACTOR

    def _bisect(self) -> None:
        while self._room() and self._bracketed() and not self._narrow():
            self._take((self.lo + self.hi) / 2, "bisect")

    def _room(self) -> bool:
        return len(self.steps) < self.max_steps

    def _bracketed(self) -> bool:
        return self.lo > 0 and math.isfinite(self.hi)

    def _narrow(self) -> bool:
        return (self.hi - self.lo) <= self.resolution * self.lo

    def _take(self, rate: float, phase: str) -> CapacityStep:
        started = time.monotonic()
        step = self.measure(rate, phase)
        self._spent_s += time.monotonic() - started
        self.steps.append(step)
        self._rates.append(rate)
        self._bracket()
        self.say(self._line(step, phase))
        return step

    def _bracket(self) -> None:
        """The lowest rate that missed, and the highest that met the SLOs below it."""
        missed = [r for r, s in zip(self._rates, self.steps, strict=True) if not s.meets]
        self.hi = min(missed, default=math.inf)
        met = [r for r, s in zip(self._rates, self.steps, strict=True) if s.meets and r < self.hi]
        self.lo = max(met, default=0.0)

    def steps_left(self) -> int:
        """An estimate of the rates still to measure: the sweep's next one if unbracketed,
        then the halvings that bring the bracket within the resolution."""
        if self._bracketed():
            width = (self.hi - self.lo) / (self.resolution * self.lo)
            need = max(0, math.ceil(math.log2(width))) if width > 1 else 0
        else:
            need = 1 + math.ceil(math.log2((SWEEP_FACTOR - 1) / self.resolution))
        need += int(self._confirming)
        return min(need, self.max_steps - len(self.steps))

    def _line(self, step: CapacityStep, phase: str) -> str:
        verdict_text = "meets the SLOs" if step.meets else f"misses: {step.why}"
        e2e = step.p99_s.get("e2e")
        shown = f"P99 E2E {e2e:.3g} s, " if e2e is not None else ""
        left = self.steps_left()
        mean = self._spent_s / len(self.steps)
        more = f"{left} more rate{'s' if left > 1 else ''} at most"
        eta = f"~{duration(mean * left)} left ({more})" if left else "done"
        return (
            f"capacity {len(self.steps)}/{self.max_steps} ({phase}) {step.offered_rps:.3g} "
            f"req/s: {shown}goodput {step.goodput_rps:.3g} req/s, {verdict_text}; {eta}"
        )
