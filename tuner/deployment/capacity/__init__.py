"""`tuner capacity`: how many requests per second the chosen configuration sustains within the
study's SLOs, measured on the real server, and what a target load then needs.

The server runs the chosen configuration (the final incumbent, or ``--trial``) once; Locust
offers open-loop arrivals at a sequence of rates (a coarse sweep, then bisection:
:mod:`tuner.deployment.capacity.sweep`) until the highest rate whose P99s meet the SLOs with an
error rate within its limit is bracketed. Then ``replicas = ceil(R x (1 + headroom) / rate)``,
GPUs and cost per month (:mod:`tuner.plan.sizing`). The result, with the goodput curve, is kept
in ``studies/<name>/capacity/``, where ``tuner export --format k8s`` finds its replica count.

A study rehearsed on the simulated GPU host (``server=simulated_gpu``) runs its capacity search
there too: its result is no measurement of real GPUs, so the printed result and ``capacity.json``
open with the study's SIMULATED stamp (:attr:`Review.simulated`, the line its report, export and
check open with) and its rate per replica reads "(simulated)", not "(measured)".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.config import TunerConfig
from tuner.deployment.capacity.goodput_plot import write_goodput_png
from tuner.deployment.capacity.rate_load import ServedConfig
from tuner.deployment.capacity.stored_config import stored_config
from tuner.deployment.capacity.sweep import CapacitySearch, SweepResult
from tuner.errors import ArtifactError, ConfigError
from tuner.plan.sizing import (
    CAPACITY_DIR,
    CapacityRecord,
    Sizing,
    check_target,
    server_price,
    size,
    write_capacity,
)
from tuner.review.stored import Choice, Review, open_review
from tuner.search import space as search_space
from tuner.search.resolved import ResolvedLaunch, resolve_params

Progress = Callable[[str], None]
DEFAULT_START_RPS = 1.0


@dataclass(frozen=True)
class CapacityRequest:
    """What `tuner capacity` was asked."""

    study: str
    storage: str | None = None
    studies_dir: Path = Path("studies")
    trial: int | None = None
    stage: str | None = None
    target_rps: float | None = None
    headroom: float = 0.3
    start_rps: float | None = None
    window_s: float | None = None
    max_steps: int = 10

    def check(self) -> None:
        """Bad input is one line and exit 2, before the study is even opened."""
        if self.target_rps is not None:
            check_target(self.target_rps, self.headroom)
        elif not 0 <= self.headroom < 1:
            raise ConfigError(f"headroom must be in [0, 1), got {self.headroom:g}")
        if self.start_rps is not None and not self.start_rps > 0:
            raise ConfigError(f"--start-rps must be > 0, got {self.start_rps:g}")
        if self.window_s is not None and not self.window_s > 0:
            raise ConfigError(f"--window-s must be > 0, got {self.window_s:g}")
        if self.max_steps < 2:
            raise ConfigError(f"--max-steps must be >= 2 (a bracket), got {self.max_steps}")


def _choice(review: Review, request: CapacityRequest) -> Choice:
    """The configuration to measure; ConfigError when the study has no completed trial."""
    if not any(view.measured for view in review.trials()):
        raise ConfigError(
            f"study {review.name!r} has no completed trial: nothing to measure the capacity of",
            hint="run the study first (tuner run)",
        )
    choice = review.choice(request.stage, request.trial)
    if choice.trial is None or not choice.trial.measured:
        raise ConfigError(f"{choice.label} has no measurement of its own", hint="pass --trial")
    return choice


def _check_slo(config: TunerConfig) -> None:
    slo = config.slo
    if max(slo.p99_e2e_s, slo.p99_ttft_s, slo.p99_tpot_s) <= 0:
        raise ConfigError(
            "the study sets no latency SLO: every rate would meet it",
            hint="capacity is judged against slo.p99_e2e_s, p99_ttft_s or p99_tpot_s",
        )


def _start_rate(request: CapacityRequest, choice: Choice) -> float:
    """--start-rps, else the rate the study measured for this configuration (closed loop)."""
    if request.start_rps:
        return request.start_rps
    assert choice.trial is not None
    measured = choice.trial.metric("request_throughput_req_s")
    return measured if measured and measured > 0 else DEFAULT_START_RPS


def capacity_command(request: CapacityRequest, progress: Progress) -> int:
    """Run the search, write capacity.json and goodput.png, print the result."""
    request.check()
    review = open_review(request.study, request.storage, request.studies_dir)
    choice = _choice(review, request)
    config = stored_config(review.config, review.name)
    _check_slo(config)
    # The study's own stamp, so that a rehearsal's capacity reads as its report and export do;
    # its server (the stored config's) is the simulated host again, so every window is one.
    simulated = review.simulated
    if simulated:  # first on the terminal too: the progress lines come before the result
        progress(simulated)
    specs = search_space.flatten(config.search_space)
    launch = resolve_params(choice.params, specs, config.server)
    folder = review.paths.root / CAPACITY_DIR
    start = _start_rate(request, choice)
    progress(f"capacity of {choice.label}: starting its server, then rates from {start:.3g} req/s")
    with ServedConfig(config, launch, folder) as served:
        search = CapacitySearch(
            lambda rate, phase: served.measure(rate, phase, request.window_s),
            start,
            request.max_steps,
            progress=progress,
        )
        found = search.run()
        cpus = served.server_cpus
    record = _record(review, choice, config, found, launch)
    if request.target_rps is not None and found.max_rps > 0:
        record.sizing = _sizing(request, review, config, record, cpus)
    path = _write(review.paths.root, record, simulated)
    write_goodput_png(record, folder / "goodput.png", simulated)
    print("\n".join(summary(record, simulated)))
    print(f"result: {path}, {folder / 'goodput.png'}")
    return 0 if found.max_rps > 0 else 1


def _record(
    review: Review, choice: Choice, config: TunerConfig, found: SweepResult, launch: ResolvedLaunch
) -> CapacityRecord:
    devices = launch.devices if config.server.device == "cuda" else 0
    slo = {
        "p99_ttft_s": config.slo.p99_ttft_s,
        "p99_tpot_s": config.slo.p99_tpot_s,
        "p99_e2e_s": config.slo.p99_e2e_s,
        "max_error_rate": config.slo.max_error_rate,
    }
    return CapacityRecord(
        study=review.name,
        choice=choice.label,
        params=dict(choice.params),
        max_rps=found.max_rps,
        upper_rps=found.upper_rps,
        slo=slo,
        steps=found.steps,
        devices=devices,
        confirmed=found.confirmed,
    )


def _write(study_root: Path, record: CapacityRecord, simulated: str | None) -> Path:
    """``capacity.json``; a rehearsal's opens with its stamp under "simulated", the first key of
    its evidence.json and check.json too, so that no reader of the file takes it for a measurement.
    """
    path = write_capacity(study_root, record)  # the folder, the file, and their errors
    if not simulated:
        return path
    stamped = {"simulated": simulated, **record.to_dict()}
    tmp = path.with_suffix(".tmp")
    try:  # replaced whole, as write_capacity does: a reader never sees half a file
        tmp.write_text(json.dumps(stamped, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def _sizing(
    request: CapacityRequest, review: Review, config: TunerConfig, record: CapacityRecord, cpus: int
) -> Sizing:
    gpus = (review.fingerprint.get("hardware") or {}).get("gpus") or [""]
    gpu = config.cost.gpu_model or str(gpus[0])
    price = server_price(config.cost, config.server.device, gpu, record.devices, cpus)
    assert request.target_rps is not None
    return size(request.target_rps, request.headroom, record.max_rps, record.devices, price)


def _second(record: CapacityRecord) -> str:
    """What the confirmation said: the bracket's width is the search's resolution; a second
    window that disagrees shows the noise between windows on this host."""
    confirms = [s for s in record.steps if s.phase == "confirm"]
    if record.confirmed:
        said = f"a second window at {record.max_rps:.3g} req/s met the SLOs again"
    elif confirms:
        said = (
            f"a second window at {confirms[0].offered_rps:.3g} req/s missed them, so the "
            "search went on below it: windows disagree by more than the resolution here"
        )
    else:
        said = "no second window (the step budget ran out): raise --max-steps to confirm"
    return f"  {said}; the uncertainty is the search's resolution, not this host's noise"


def summary(record: CapacityRecord, simulated: str | None = None) -> list[str]:
    """What the search found, in words a capacity plan can quote; a rehearsal's (``simulated``,
    the study's stamp) opens with that stamp, and its rate is "simulated", never "measured"."""
    head = [simulated] if simulated else []
    if record.max_rps <= 0:
        lowest = min((s.offered_rps for s in record.steps), default=0.0)
        return [*head, f"capacity: no rate met the SLOs, down to {lowest:.3g} req/s"]
    if math.isinf(record.upper_rps):
        bound = "every rate measured met the SLOs: raise --max-steps or --start-rps for a bound"
    else:
        bound = (
            f"the SLOs break between {record.max_rps:.3g} and {record.upper_rps:.3g} req/s "
            f"(uncertainty {record.uncertainty_rps:.2g} req/s)"
        )
    lines = [
        *head,
        f"capacity of {record.choice}: {record.max_rps:.3g} req/s; {bound}",
        _second(record),
    ]
    if record.sizing is not None:
        lines += record.sizing.lines("simulated" if simulated else "measured")
    return lines
