"""What `tuner check` and `tuner compare` share: the endpoint, its key, and measured windows.

A window is measured exactly as a trial measures one (tuner/trial/run.py): the Locust load generator
drives the endpoint with the workload (warm-up, window, drain) and :func:`tuner.measurement.measure`
summarises the requests of the window. Nothing is started or stopped: the endpoint is someone
else's. The API key is read from an environment variable and only ever sent as a header.

Bad input ends here as one line and exit 2 (:class:`EndpointError`): a URL that is not
http(s), a variable that is not set, an endpoint that does not answer within a bounded wait,
one that refuses the key, one that serves another model.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tuner.config import SloConfig, check_http_url
from tuner.config.workload import WorkloadConfig
from tuner.errors import ConfigError
from tuner.loadgen import LocustLoadGenerator, Target
from tuner.measurement.records import read_records
from tuner.measurement.stats import Measurements, measure
from tuner.scoring import objective as obj
from tuner.scoring.feasibility import mean_constraints
from tuner.server.external import base_url, completion_status, served_models
from tuner.study.decision.noise import NoiseEstimate

Say = Callable[[str], None]


class EndpointError(ConfigError):
    """The endpoint cannot be measured as asked (exit 2, like any other bad input)."""


@dataclass(frozen=True)
class Endpoint:
    """A running server as requests reach it."""

    url: str  # base URL, without /v1
    api_key: str | None
    model: str  # the served name every request carries


def api_key_from(variable: str | None, option: str = "--api-key-env") -> str | None:
    """The key held by ``variable`` (None when no variable is named). Never from argv."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise ConfigError(
            f"{option} names {variable!r}, which is not set in the environment",
            hint=f"export {variable}=<the endpoint's API key>, or leave {option} out",
        )
    return value


def _same_model(entry: Mapping[str, Any], wanted: Iterable[str]) -> bool:
    names = {str(entry.get("id") or ""), str(entry.get("root") or "")}
    tails = {Path(n.rstrip("/")).name for n in names if n}
    return any(w in names or Path(w.rstrip("/")).name in tails for w in wanted if w)


def open_endpoint(
    url: str, api_key: str | None, wanted: Sequence[str], wait_s: float, option: str = "--url"
) -> Endpoint:
    """Wait (at most ``wait_s``) until ``url`` lists a model named ``wanted`` (a served name or
    a model path; any when empty) and answers a one-token completion of it with the key."""
    check_http_url(url, option)
    deadline = time.monotonic() + wait_s
    while True:
        model, status, last = _probe(url, api_key, wanted)
        if status in (401, 403):
            raise EndpointError(
                f"{base_url(url)} refused the API key ({last})",
                hint="--api-key-env must name the variable that holds this endpoint's key",
            )
        if status == 200:
            return Endpoint(base_url(url), api_key, model)
        if 400 <= status < 500:
            raise EndpointError(f"{base_url(url)}: {last}", hint="is --url the right deployment?")
        if time.monotonic() >= deadline:
            raise EndpointError(f"{base_url(url)} did not answer within {wait_s:.0f} s ({last})")
        time.sleep(1.0)


def _probe(url: str, api_key: str | None, wanted: Sequence[str]) -> tuple[str, int, str]:
    """(the served name picked, a one-token completion's status or 0, what happened)."""
    try:
        entries = served_models(url, api_key)
    except PermissionError as exc:
        return "", 401, str(exc)
    except (requests.RequestException, ValueError) as exc:
        return "", 0, type(exc).__name__
    matches = [e for e in entries if not wanted or _same_model(e, wanted)]
    if not matches:
        served = ", ".join(str(e["id"]) for e in entries) or "no model"
        return "", 404, f"serves {served}, not {' / '.join(w for w in wanted if w)}"
    model = str(matches[0]["id"])
    try:
        status = completion_status(url, api_key, model)
    except requests.RequestException as exc:
        return model, 0, type(exc).__name__
    return model, status, f"a one-token completion of {model} got HTTP {status}"


def measure_window(
    endpoint: Endpoint,
    tokenizer: str,
    workload: WorkloadConfig,
    slo: SloConfig,
    out_dir: Path,
    client_cpus: Sequence[int] | None = None,
) -> Measurements:
    """One load run against the endpoint and its measurement, as a trial takes it."""
    target = Target(endpoint.url, endpoint.api_key, endpoint.model, tokenizer)
    result = LocustLoadGenerator(cpus=client_cpus).run(target, workload, out_dir)
    records = list(read_records(result.records_path))
    return measure(
        records,
        result.window_start,
        result.window_end,
        slo,
        timeout_s=workload.request_timeout_s,
    )


@dataclass
class Scoring:
    """Objectives (name -> direction) and constraints, as the study scored its trials."""

    objectives: dict[str, str]
    constraints: list[str]
    context: obj.ObjectiveContext

    def values(self, m: Measurements) -> dict[str, float]:
        return {n: obj.get_objective(n).value(m, self.context) for n in self.objectives}

    def violations(self, windows: Sequence[Measurements]) -> dict[str, float]:
        """Each constraint's mean violation over the windows (<= 0: met), for those that apply
        (an SLO that is not set reports the same "unset" value in every window)."""
        # the study's constraints, and each class SLO the evidence sets (a constraint a study
        # adds per class, never listed in objectives.constraints): a row per class SLO
        names = list(self.constraints)
        names += [c.name for c in obj.class_slos(self.context.slo) if c.name not in names]
        per_window = [
            {n: obj.get_constraint(n, self.context.slo).violation(m, self.context) for n in names}
            for m in windows
        ]
        means = mean_constraints(per_window)
        return {n: v for n, v in means.items() if any(w[n] != obj.UNSET_SLO for w in per_window)}


def pooled_with(prior: NoiseEstimate, values: Sequence[float]) -> NoiseEstimate:
    """The study's noise with this comparison's own repeats added, as the study pools them."""
    own = NoiseEstimate.of(values)
    ss = sum(e.rel_sd**2 * e.df for e in (prior, own) if e.df > 0 and math.isfinite(e.rel_sd))
    df = sum(e.df for e in (prior, own) if e.df > 0 and math.isfinite(e.rel_sd))
    return NoiseEstimate(math.sqrt(ss / df) if df else math.nan, df)


def finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(v) for v in values)


CheckEndpoint = Endpoint  # its name in tuner's public API
