"""A StudyRunner whose trials look measurements up in a landscape instead of starting servers.

:func:`run_study` runs tuner's own :class:`~tuner.study.loop.runner.StudyRunner` (samplers from the
registry, search_space, evaluation, the acceptance rule, a real Optuna SQLite storage) with
:func:`lookup_trials` as its ``trial_fn``, the runner's public seam for the trial function:
each launch draws one of its configuration's measured repeats, and the run's launches and
stored decisions come back as a :class:`~tuner.testing.run_trace.RunTrace`. The tests drive a
StudyRunner of their own with the same pieces (:func:`study_config`, :func:`lookup_trials`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from tuner.composition import compose
from tuner.config import ParamSpec, SamplerConfig, TunerConfig
from tuner.errors import TunerError
from tuner.measurement.stats import Measurements, MetricStats
from tuner.plan.planner import Planner
from tuner.schema import StudyAttr, TrialStatus
from tuner.scoring.confidence import confidently_met, undecided
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import ResolvedLaunch
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.prescreen import Prescreen
from tuner.study.loop.runner import StudyRunner, TrialFn
from tuner.testing.landscape import MAX_ERROR_RATE, Landscape, Measured
from tuner.testing.run_trace import Launch, RunTrace, incumbent_timeline
from tuner.trial.outcome import TrialOutcome

WINDOW_S = 10.0  # the grid's window: only used to rebuild counts from rates
# The study's SQLite file: in memory-backed /dev/shm when there is one (a commit there costs
# microseconds; on a busy disk each of a run's ~1,000 commits waited ~15 ms for fsync).
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None


class _FallbackCounter(logging.Handler):
    """Counts Optuna's "sampled independently ... instead of <Sampler>" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "sampled independently" in record.getMessage():
            self.count += 1


@contextlib.contextmanager
def count_fallbacks() -> Iterator[_FallbackCounter]:
    counter = _FallbackCounter()
    logger = optuna.logging.get_logger("optuna")
    logger.addHandler(counter)
    optuna.logging.disable_default_handler()  # counted per run instead of printed
    try:
        yield counter
    finally:
        optuna.logging.enable_default_handler()
        logger.removeHandler(counter)


def outcome_of(measured: Measured, launch: LaunchSpec, trial_id: str) -> TrialOutcome:
    """The TrialOutcome run_trial would have returned for this measurement."""
    outcome = TrialOutcome(trial_id, TrialStatus.FAILED, [], launch, reason=measured.reason)
    if not measured.ok:
        outcome.message = "replayed failure"
        return outcome
    n, failed = measured.completed, measured.failed
    m = Measurements(
        ttft=_stats(n, measured.p50_ttft_s, measured.p99_ttft_s),
        tpot=_stats(n, measured.p50_tpot_s, measured.p99_tpot_s),
        itl=MetricStats(),
        e2e=_stats(n, measured.p50_e2e_s, measured.p99_e2e_s),
        window_s=WINDOW_S,
        requests_started=n + failed,
        completed=n,
        failed=failed,
        errors_by_kind={},
        error_rate=measured.error_rate,
        request_throughput=measured.request_per_s,
        output_throughput=measured.output_tok_s,
        total_throughput=measured.output_tok_s,
        goodput=0.0,
        mean_prompt_tokens=None,
        mean_output_tokens=None,
        dispatch_lag_p99_s=None,
    )
    outcome.status, outcome.reason, outcome.measurements = TrialStatus.OK, "", m
    return outcome


def _stats(n: int, p50: float | None, p99: float | None) -> MetricStats:
    return MetricStats(n=n, p50=p50, p99=p99) if p99 is not None else MetricStats()


def lookup_trials(land: Landscape, rng: np.random.Generator, launches: list[Launch]) -> TrialFn:
    """A trial function for StudyRunner that looks the launch up in the table."""

    def lookup_trial(
        config: TunerConfig,
        launch: ResolvedLaunch,
        paths: Any,
        trial_id: str,
        progress: Any = None,
    ) -> TrialOutcome:
        key = land.key(launch.spec.args)  # the table is keyed by the candidate's own flags
        measured = land.draw(key, rng)
        launches.append(Launch(trial_id.rsplit("-", 1)[0], key, measured))
        return outcome_of(measured, launch.record(), trial_id)

    return lookup_trial


@dataclass(frozen=True)
class StudyStrategy:
    """A StudyRunner configuration: staged or joint, a sampler, a budget."""

    name: str
    strategy: str  # staged | joint
    sampler: str
    trials_per_stage: int
    repeats: int = 2
    n_startup_trials: int = 2
    options: Mapping[str, Any] = field(default_factory=dict)
    refine_trials: int = 0  # staged only: study.refine_trials (a last joint stage)
    baseline_measurements: int = 3  # study.baseline_measurements (the schema's default)
    noise: str = "pooled"  # study.noise: the acceptance rule's noise estimate
    count_search_window: bool = True  # study.count_search_window
    # study.prescreen: the plan's estimator refuses what it says cannot start and queues its
    # best points first in each stage (the base config must name the system and model)
    prescreen: bool = False
    stages: tuple[str, ...] = ()  # study.stages when a group comes twice (default: the space's)
    max_repeats: int | None = None  # study.max_repeats (None: the schema's default)


def base_config() -> TunerConfig:
    """The configuration a replay starts from: compose([]) as the CPU tables measured it, with
    Optuna's and the study's expected warnings silenced (a replay runs thousands of trials)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # StudyRunner records heartbeats around its ask/tell trials on purpose: not a mistake here.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    # The tables measured vLLM's defaults plus the CPU server's fixed args, not the
    # quickstart's under-tuned deployment command.
    return compose(["server.from_command=null"])


def categorical_space(
    land: Landscape, groups: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, ParamSpec]]:
    """Each param as a categorical over the table's values, grouped into stages."""
    axes = land.values()
    return {
        group: {p: ParamSpec(type="categorical", choices=list(axes[p])) for p in params}
        for group, params in groups.items()
    }


def study_config(
    base: TunerConfig,
    s: StudyStrategy,
    space: Mapping[str, Mapping[str, ParamSpec]],
    slo: float,
    seed: int,
    folder: Path,
) -> TunerConfig:
    config = copy.deepcopy(base)
    config.name, config.studies_dir = f"replay-{s.name}-{seed}", str(folder)
    config.search_space = {g: dict(specs) for g, specs in space.items()}
    config.study.strategy, config.study.stages = s.strategy, list(s.stages or space)
    config.study.trials_per_stage, config.study.repeats, config.study.seed = (
        s.trials_per_stage,
        s.repeats,
        seed,
    )
    config.study.refine_trials = s.refine_trials
    config.study.baseline_measurements, config.study.noise = s.baseline_measurements, s.noise
    config.study.count_search_window = s.count_search_window
    if s.max_repeats is not None:
        config.study.max_repeats = s.max_repeats
    config.study.prescreen = s.prescreen
    config.study.storage = f"sqlite:///{folder}/replay.db"
    config.study.max_consecutive_failures = 10_000  # report the path, do not stop on failures
    config.study.max_failure_rate = 1.0
    config.sampler = SamplerConfig(s.sampler, s.n_startup_trials, dict(s.options))
    config.slo.p99_e2e_s, config.slo.max_error_rate = slo, MAX_ERROR_RATE
    config.quality.enabled = False  # the table holds no model outputs to score
    return config


def run_study(
    land: Landscape,
    base: TunerConfig,
    s: StudyStrategy,
    space: Mapping[str, Mapping[str, ParamSpec]],
    slo: float,
    seed: int,
) -> RunTrace:
    trace = RunTrace(s.name, seed)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="replay-", dir=SCRATCH) as tmp:
        config = study_config(base, s, space, slo, seed, Path(tmp))
        lookup = lookup_trials(land, rng, trace.launches)
        runner = StudyRunner(config, Evaluator(config), {"replay": seed}, quiet, trial_fn=lookup)
        # What vLLM's config builder tells a real study: a param left out runs the table's
        # default (the launch the table measured for it).
        runner.as_run.server_values = lambda params, _specs: land.params_of(land.key(params))
        if s.prescreen:  # what Session.open attaches; no vLLM config check without vLLM's GPU
            runner.prescreen = Prescreen(config, runner.evaluator, quiet, None, Planner(config))
        with count_fallbacks() as fallbacks:
            try:
                result = runner.run()
                found = result.final_claims()
                trace.believed_feasible = confidently_met(found)
                trace.on_edge = [c.name for c in undecided(found)]
            except TunerError as exc:
                trace.stopped = exc.one_line()
        trace.independent_samples = fallbacks.count
        decisions = stored_decisions(config, runner)
    trace.selected = incumbent_timeline(trace.launches, decisions, land)
    trace.decisions = [d.line() for d in decisions]
    return trace


def quiet(_message: str) -> None:
    """A progress callback that prints nothing (a replay runs thousands of trials)."""
    return None


def stored_decisions(config: TunerConfig, runner: StudyRunner) -> list[Decision]:
    """Every stage decision the run stored (also those before an early stop)."""
    out = []
    for stage in runner.stages:
        try:
            st = optuna.load_study(study_name=f"{config.name}:{stage.name}", storage=runner.storage)
        except KeyError:
            continue
        if StudyAttr.DECISION in st.user_attrs:
            out.append(Decision.from_dict(st.user_attrs[StudyAttr.DECISION]))
    return out
