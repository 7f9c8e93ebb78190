"""A compact, editable workload fitted to real traffic, and how close it is to its source.

Lengths become empirical quantiles (the lengths at evenly spaced probabilities, drawn by
inverse-CDF interpolation); arrivals become a rate and a gamma shape (burstiness = 1/CV² of the
inter-arrival gaps, so a Poisson source fits shape 1). The fidelity check draws from the written
config as the load generator would and compares: the KS distance of each length distribution
and the arrival CV of source and fit. A trace whose requests have classes is fitted class by
class (its weight: its share of the requests; its own quantiles), under one arrival process;
each class's KS is checked besides the mix's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tuner.config.workload import LengthDist, PrefixConfig, RequestClass, WorkloadConfig
from tuner.traffic.trace import Trace

QUANTILES = 101  # lengths at p = 0, 0.01, ..., 1: KS error of the interpolation <= 0.01
FIDELITY_DRAWS = 20_000
# A gamma shape below this makes gaps so skewed that a short window holds almost no arrivals.
MIN_BURSTINESS = 0.001
_STREAM_FIDELITY = 21


def empirical_draws(quantiles: list[float], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths by inverse-CDF interpolation between evenly spaced quantiles."""
    q = np.asarray(quantiles, dtype=float)
    return np.interp(rng.random(n), np.linspace(0.0, 1.0, len(q)), q)


def empirical(values: np.ndarray, n_quantiles: int = QUANTILES) -> LengthDist:
    """The empirical length distribution of ``values`` as ``n_quantiles`` quantiles."""
    q = np.quantile(values, np.linspace(0.0, 1.0, n_quantiles), method="inverted_cdf")
    return from_quantiles([float(v) for v in q], float(np.mean(values)))


def from_quantiles(quantiles: list[float], mean: float) -> LengthDist:
    low, high = math.floor(quantiles[0]), math.ceil(quantiles[-1])
    mean = min(max(mean, low), high)
    return LengthDist(
        kind="empirical", mean=round(mean, 1), low=low, high=high, quantiles=quantiles
    )


def gaps_cv(arrivals: np.ndarray) -> float:
    """The coefficient of variation of the inter-arrival gaps (1 for a Poisson process)."""
    gaps = np.diff(np.sort(arrivals))
    return float(np.std(gaps) / np.mean(gaps)) if len(gaps) > 1 and np.mean(gaps) > 0 else 1.0


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov distance: the largest gap between the two CDFs."""
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


@dataclass
class ClassFidelity:
    """How close one fitted class is to its requests in the source."""

    name: str
    requests: int
    share: float  # of the source's requests
    prompt_ks: float
    output_ks: float

    def line(self) -> str:
        return (
            f"class {self.name}: {self.share:.1%} of requests ({self.requests}), KS distance "
            f"of prompt lengths {self.prompt_ks:.3f}, of output lengths {self.output_ks:.3f}"
        )


@dataclass
class Fidelity:
    """How close a fitted workload is to its source (the mix of its classes, and each class
    where there are several)."""

    prompt_ks: float
    output_ks: float
    source_cv: float | None  # None: the source has no arrival times (metrics)
    fit_cv: float
    notes: list[str] = field(default_factory=list)
    classes: list[ClassFidelity] = field(default_factory=list)

    def lines(self) -> list[str]:
        source = "unknown" if self.source_cv is None else f"{self.source_cv:.2f}"
        mix = " (all classes)" if self.classes else ""
        out = [
            f"KS distance of prompt lengths{mix}: {self.prompt_ks:.3f}",
            f"KS distance of output lengths{mix}: {self.output_ks:.3f}",
            f"arrival CV: source {source}, fit {self.fit_cv:.2f}",
        ]
        return out + [c.line() for c in self.classes] + self.notes


@dataclass
class Fit:
    """A fitted workload and its fidelity."""

    workload: WorkloadConfig
    fidelity: Fidelity
    source: str
    requests: int
    span_s: float | None = None
    prefix_hit_rate: float | None = None


def draw_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths drawn from a fitted distribution as the load generator draws them."""
    values = empirical_draws(dist.quantiles, n, rng)
    return np.clip(np.rint(values), max(1, dist.low), dist.high).astype(np.int64)


def fit_cv(workload: WorkloadConfig, seed: int) -> float:
    """The arrival CV of the fit, measured on gaps drawn as the load generator draws them."""
    rng = np.random.default_rng([seed, _STREAM_FIDELITY, 1])
    shape = workload.burstiness
    gaps = rng.gamma(shape, 1.0 / (workload.rate * shape), FIDELITY_DRAWS)
    return float(np.std(gaps) / np.mean(gaps))


def fitted_workload(
    prompt: LengthDist, output: LengthDist, rate: float, cv: float
) -> WorkloadConfig:
    cls = RequestClass(name="fitted", prompt_tokens=prompt, output_tokens=output)
    return fitted_mix([cls], rate, cv)


def fitted_mix(classes: list[RequestClass], rate: float, cv: float) -> WorkloadConfig:
    """An open-loop workload of these classes at ``rate``, gamma gaps of the source's ``cv``."""
    burstiness = max(MIN_BURSTINESS, round(1.0 / cv**2, 4)) if cv > 0 else 1.0
    return WorkloadConfig(
        classes=classes,
        mode="open",
        rate=round(rate, 4),
        burstiness=burstiness,
        concurrency=512,
        prefix=PrefixConfig(),
    )


def _mix_draws(
    classes: list[RequestClass], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths drawn from the fitted mix as the load generator draws them:
    each request's class by weight, then its lengths from that class."""
    if len(classes) == 1:
        only = classes[0]
        prompts = draw_lengths(only.prompt_tokens, FIDELITY_DRAWS, rng)
        return prompts, draw_lengths(only.output_tokens, FIDELITY_DRAWS, rng)
    weights = np.array([c.weight for c in classes], dtype=float)
    which = rng.choice(len(classes), size=FIDELITY_DRAWS, p=weights / weights.sum())
    prompts = np.zeros(FIDELITY_DRAWS, dtype=np.int64)
    outputs = np.zeros(FIDELITY_DRAWS, dtype=np.int64)
    for k, rc in enumerate(classes):
        mask = which == k
        prompts[mask] = draw_lengths(rc.prompt_tokens, int(mask.sum()), rng)
        outputs[mask] = draw_lengths(rc.output_tokens, int(mask.sum()), rng)
    return prompts, outputs


def _fit_classes(trace: Trace) -> tuple[list[RequestClass], list[np.ndarray], list[str]]:
    """One fitted class per class of the trace's requests (one, ``fitted``, for a trace without
    classes): its weight its share of the requests, its own length quantiles; the requests of
    each, and notes on a rule's classes that hold none."""
    names = trace.request_classes
    if names is None:
        everyone = np.ones(len(trace), dtype=bool)
        only = RequestClass(
            name="fitted",
            prompt_tokens=empirical(trace.prompt_tokens),
            output_tokens=empirical(trace.output_tokens),
        )
        return [only], [everyone], []
    labels = np.asarray(names, dtype=object)
    classes, masks = [], []
    for name in trace.class_names:
        mask = labels == name
        rc = RequestClass(
            name=name,
            weight=max(1e-6, round(int(mask.sum()) / len(trace), 6)),  # > 0, as validated
            prompt_tokens=empirical(trace.prompt_tokens[mask]),
            output_tokens=empirical(trace.output_tokens[mask]),
        )
        classes.append(rc)
        masks.append(mask)
    empty = [name for name in trace.class_order if name not in trace.class_names]
    notes = [f"class {name} holds no request of the trace: left out" for name in empty]
    return classes, masks, notes


def fit_trace(trace: Trace, seed: int = 0) -> Fit:
    """Fit a workload to a whole trace and check it against the trace: the mix's lengths, and
    each class's where its requests have several."""
    classes, masks, notes = _fit_classes(trace)
    span = trace.span_s
    rate = (len(trace) - 1) / span if span > 0 else 1.0
    source_cv = gaps_cv(trace.arrivals)
    workload = fitted_mix(classes, rate, source_cv)
    rng = np.random.default_rng([seed, _STREAM_FIDELITY])
    prompts, outputs = _mix_draws(classes, rng)
    fidelity = Fidelity(
        prompt_ks=ks_distance(prompts, trace.prompt_tokens),
        output_ks=ks_distance(outputs, trace.output_tokens),
        source_cv=source_cv,
        fit_cv=fit_cv(workload, seed),
        notes=notes,
    )
    if len(classes) > 1:
        for rc, mask in zip(classes, masks, strict=True):
            fidelity.classes.append(_class_fidelity(trace, rc, mask, rng))
    if workload.burstiness == MIN_BURSTINESS and source_cv > 0:
        fidelity.notes.append(
            f"burstiness held at {MIN_BURSTINESS} (the source's CV asks 1/CV^2 = "
            f"{1 / source_cv**2:.4f}): gamma gaps cannot follow bursts that extreme; replay "
            "the trace itself (workload=trace) to keep them"
        )
    return Fit(workload, fidelity, trace.source, len(trace), span)


def _class_fidelity(
    trace: Trace, rc: RequestClass, mask: np.ndarray, rng: np.random.Generator
) -> ClassFidelity:
    n = int(mask.sum())
    prompts = draw_lengths(rc.prompt_tokens, FIDELITY_DRAWS, rng)
    outputs = draw_lengths(rc.output_tokens, FIDELITY_DRAWS, rng)
    return ClassFidelity(
        name=rc.name,
        requests=n,
        share=n / len(trace),
        prompt_ks=ks_distance(prompts, trace.prompt_tokens[mask]),
        output_ks=ks_distance(outputs, trace.output_tokens[mask]),
    )
