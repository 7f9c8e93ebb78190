"""Replay search strategies against a measured table instead of starting servers.

A "trial" looks its configuration up in a table of real measurements (benchmarks/measure_grid.py)
and returns one of that configuration's repeats, drawn at random, so the strategies see the real
run-to-run noise. The staged and joint strategies are tuner's own :class:`~tuner.study.StudyRunner`
(samplers from the registry, search_space, evaluation, the acceptance rule, a real Optuna storage)
with the lookup as its ``trial_fn`` (:func:`lookup_trials`) instead of tuner.trial.run_trial.
The full grid in vLLM auto_tune's order, and vLLM's defaults alone, need no sampler and are
plain loops.

Each run is scored against the table's *truth* (every configuration's mean over its repeats):

- selection: what the run would hand over after t launches (for StudyRunner strategies, the
  incumbent: accepted decisions only; for the others, the best feasible observed launch), scored
  as its true select_by value / the grid's best feasible one, 0 when truly infeasible;
- trials to 97 %: the first t whose selection scores >= 0.97;
- hypervolume after t launches: the true (P99 E2E, output tok/s) of every configuration launched
  so far (failed ones excluded), relative to the hypervolume of the whole grid.

    .venv/bin/python benchmarks/replay.py --seeds 20          # writes benchmarks/results/replay*
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

import tuner.study as study_module  # noqa: E402
from benchmarks.landscape import (  # noqa: E402
    MAX_ERROR_RATE,
    Landscape,
    Measured,
    landscape_rows,
    median_slo,
    reference,
)
from benchmarks.scoring import (  # noqa: E402
    Launch,
    RunTrace,
    aggregate,
    best_observed,
    incumbent_timeline,
    markdown,
    summarize_run,
)
from tuner.acceptance import Decision  # noqa: E402
from tuner.cli import compose  # noqa: E402
from tuner.config import ParamSpec, SamplerConfig, TunerConfig  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.evaluation import Evaluator  # noqa: E402
from tuner.measure import Measurements, MetricStats  # noqa: E402
from tuner.server import LaunchSpec  # noqa: E402
from tuner.stage import ATTR_DECISION  # noqa: E402
from tuner.study import TrialFn  # noqa: E402
from tuner.trial import TrialOutcome  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "data" / "grid_vllm_cpu.csv"
DEFAULT_OUT = ROOT / "benchmarks" / "results"
WINDOW_S = 10.0  # the grid's window: only used to rebuild counts from rates
# The study's SQLite file: in memory-backed /dev/shm when there is one (a commit there costs
# microseconds; on a busy disk each of a run's ~1,000 commits waited ~15 ms for fsync).
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None


# ---- a run ------------------------------------------------------------------------------
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


def run_defaults(land: Landscape, slo: float, seed: int) -> RunTrace:
    rng = np.random.default_rng(seed)
    key = land.key({})
    trace = RunTrace("defaults", seed, [Launch("defaults", key, land.draw(key, rng))])
    trace.selected = best_observed(trace.launches, land, slo)
    return trace


def run_grid(land: Landscape, slo: float, seed: int) -> RunTrace:
    rng = np.random.default_rng(seed)
    launches = [Launch("grid", k, land.draw(k, rng)) for k in land.grid_keys()]
    trace = RunTrace("grid", seed, launches)
    trace.selected = best_observed(launches, land, slo)
    return trace


# ---- StudyRunner with a lookup instead of run_trial ---------------------------------------
def outcome_of(measured: Measured, launch: LaunchSpec, trial_id: str) -> TrialOutcome:
    """The TrialOutcome run_trial would have returned for this measurement."""
    outcome = TrialOutcome(trial_id, "failed", [], asdict(launch), reason=measured.reason)
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
    outcome.status, outcome.reason, outcome.measurements = "ok", "", m.to_dict()
    return outcome


def _stats(n: int, p50: float | None, p99: float | None) -> MetricStats:
    return MetricStats(n=n, p50=p50, p99=p99) if p99 is not None else MetricStats()


def lookup_trials(land: Landscape, rng: np.random.Generator, launches: list[Launch]) -> TrialFn:
    """A trial function for StudyRunner that looks the launch up in the table."""

    def lookup_trial(
        config: TunerConfig, launch: LaunchSpec, paths: Any, trial_id: str, progress: Any = None
    ) -> TrialOutcome:
        key = land.key(launch.args)
        measured = land.draw(key, rng)
        launches.append(Launch(trial_id.rsplit("-", 1)[0], key, measured))
        return outcome_of(measured, launch, trial_id)

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


def study_config(
    base: TunerConfig, s: StudyStrategy, space: Mapping[str, Mapping[str, ParamSpec]],
    slo: float, seed: int, folder: Path,
) -> TunerConfig:  # fmt: skip
    config = copy.deepcopy(base)
    config.name, config.studies_dir = f"replay-{s.name}-{seed}", str(folder)
    config.search_space = {g: dict(specs) for g, specs in space.items()}
    config.study.strategy, config.study.stages = s.strategy, list(space)
    config.study.trials_per_stage, config.study.repeats, config.study.seed = (
        s.trials_per_stage, s.repeats, seed,
    )  # fmt: skip
    config.study.refine_trials = s.refine_trials
    config.study.baseline_measurements = s.baseline_measurements
    config.study.storage = f"sqlite:///{folder}/replay.db"
    config.study.max_consecutive_failures = 10_000  # report the path, do not stop on failures
    config.study.max_failure_rate = 1.0
    config.sampler = SamplerConfig(s.sampler, s.n_startup_trials, dict(s.options))
    config.slo.p99_e2e_s, config.slo.max_error_rate = slo, MAX_ERROR_RATE
    config.quality.enabled = False  # the table holds no model outputs to score
    return config


def run_study(
    land: Landscape, base: TunerConfig, s: StudyStrategy,
    space: Mapping[str, Mapping[str, ParamSpec]], slo: float, seed: int,
) -> RunTrace:  # fmt: skip
    trace = RunTrace(s.name, seed)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="replay-", dir=SCRATCH) as tmp:
        config = study_config(base, s, space, slo, seed, Path(tmp))
        lookup = lookup_trials(land, rng, trace.launches)
        runner = study_module.StudyRunner(
            config, Evaluator(config), {"replay": seed}, _quiet, trial_fn=lookup
        )
        with count_fallbacks() as fallbacks:
            try:
                runner.run()
            except TunerError as exc:
                trace.stopped = exc.one_line()
        trace.independent_samples = fallbacks.count
        decisions = stored_decisions(config, runner)
    trace.selected = incumbent_timeline(trace.launches, decisions, land)
    trace.decisions = [d.line() for d in decisions]
    return trace


def _quiet(_message: str) -> None:
    return None


def stored_decisions(config: TunerConfig, runner: study_module.StudyRunner) -> list[Decision]:
    """Every stage decision the run stored (also those before an early stop)."""
    out = []
    for stage in runner.stages:
        try:
            st = optuna.load_study(study_name=f"{config.name}:{stage.name}", storage=runner.storage)
        except KeyError:
            continue
        if ATTR_DECISION in st.user_attrs:
            out.append(Decision.from_dict(st.user_attrs[ATTR_DECISION]))
    return out


# ---- the benchmark -----------------------------------------------------------------------
def default_strategies(
    joint_trials: Sequence[int], staged_trials: Sequence[int], refine_trials: int,
    staged_samplers: Sequence[str] = ("tpe",),
) -> list[StudyStrategy]:  # fmt: skip
    """Tuner's staged search with each sampler at each stage budget (with and without the final
    joint refinement), and every sampler over the joint space at each budget."""
    out = []
    for sampler, n in itertools.product(staged_samplers, staged_trials):
        out.append(StudyStrategy(f"staged_{sampler}_{n}", "staged", sampler, n))
        if refine_trials:
            out.append(StudyStrategy(f"staged_{sampler}_{n}_refine_{refine_trials}", "staged",
                                     sampler, n, refine_trials=refine_trials))  # fmt: skip
    for n in joint_trials:
        out += [
            StudyStrategy(f"joint_tpe_{n}", "joint", "tpe", n),
            StudyStrategy(f"joint_gp_{n}", "joint", "gp", n),
            # population 6: generations of 6 (conf/sampler/nsga2.yaml explains why).
            StudyStrategy(f"joint_nsga2_{n}", "joint", "nsga2", n, 2, 0, {"population_size": 6}),
            StudyStrategy(f"joint_random_{n}", "joint", "random", n, 2, 0),
        ]
    return out


def categorical_space(
    land: Landscape, groups: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, ParamSpec]]:
    """Each param as a categorical over the table's values, grouped into stages."""
    axes = land.values()
    return {
        group: {p: ParamSpec(type="categorical", choices=list(axes[p])) for p in params}
        for group, params in groups.items()
    }


def replay(
    land: Landscape, base: TunerConfig, groups: Mapping[str, Sequence[str]], seeds: int,
    strategies: Sequence[StudyStrategy], slo: float | None = None,
    say: Callable[[str], None] = _quiet,
) -> dict[str, Any]:  # fmt: skip
    """Run every strategy over ``seeds`` seeds; per-run rows and per-strategy medians."""
    ref = reference(land, slo if slo is not None else median_slo(land))
    space = categorical_space(land, groups)
    rows: list[dict[str, Any]] = []
    for seed in range(seeds):
        traces = [
            run_defaults(land, ref.slo_p99_e2e_s, seed),
            run_grid(land, ref.slo_p99_e2e_s, seed),
        ]
        for s in strategies:
            traces.append(run_study(land, base, s, space, ref.slo_p99_e2e_s, seed))
        rows.extend(summarize_run(t, land, ref) for t in traces)
        say(f"seed {seed + 1}/{seeds} done")
    grid = len(land.grid_keys())
    table = landscape_rows(land, ref.slo_p99_e2e_s)
    spreads = {k: [r[k] for r in table if r[k] is not None] for k in ("tok_s_spread", "p99_spread")}
    noise = {f"median_{k}": round(float(np.median(v)), 3) for k, v in spreads.items() if v}
    return {
        "landscape": table,
        "noise": noise,
        "reference": {
            **asdict(ref),
            "best_config": land.params_of(ref.best_key),
            "grid_size": grid,
        },
        "summary": aggregate(rows, grid),
        "runs": rows,
    }


def explain(
    land: Landscape, base: TunerConfig, strategies: Sequence[StudyStrategy], seeds: int,
    slo: float | None,
) -> int:  # fmt: skip
    """Why each run handed over what it did: the diagnosis behind benchmarks/README.md §2 b."""
    ref = reference(land, slo if slo is not None else median_slo(land))
    space = categorical_space(land, GROUPS)
    for seed in range(seeds):
        for s in strategies:
            print(run_study(land, base, s, space, ref.slo_p99_e2e_s, seed).explain())
    return 0


def base_config() -> TunerConfig:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # StudyRunner records heartbeats around ask/tell trials on purpose (tuner/storage.py).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    return compose([])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument(
        "--throughput",
        default="output_token_rate",
        help="CSV column used as the output tok/s (the study's throughput objective)",
    )
    p.add_argument("--slo", type=float, default=None, help="P99 E2E SLO (s); default: median")
    p.add_argument(
        "--joint-trials",
        type=int,
        nargs="+",
        default=[10, 20],
        help="study.trials_per_stage of the joint runs (each sampler at each value)",
    )
    p.add_argument(
        "--staged-trials",
        type=int,
        nargs="+",
        default=[4, 8],
        help="study.trials_per_stage of the staged runs (one strategy per value)",
    )
    p.add_argument(
        "--staged-samplers",
        nargs="+",
        default=["tpe"],
        help="samplers of the staged runs (each at each --staged-trials value)",
    )
    p.add_argument("--refine-trials", type=int, default=4, help="study.refine_trials; 0: none")
    p.add_argument("--only", nargs="+", default=None, help="run only these StudyRunner strategies")
    p.add_argument(
        "--explain",
        action="store_true",
        help="print each run's launches, observations and decisions; write nothing",
    )
    return p.parse_args(argv)


# The measured grid: tuner's stage groups (conf/search_space/batching.yaml, runtime.yaml).
GROUPS = {"batching": ["max_num_seqs", "max_num_batched_tokens"], "runtime": ["enforce_eager"]}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    base = base_config()
    params = [p for ps in GROUPS.values() for p in ps]
    # A launch that leaves a flag out gets vLLM's default (the table's empty cells), except the
    # fixed server args (conf/server/vllm_cpu.yaml sets enforce_eager: true).
    defaults = {p: base.server.args.get(p) for p in params}
    land = Landscape.from_csv(args.csv, params, defaults, args.throughput)
    strategies = default_strategies(
        args.joint_trials, args.staged_trials, args.refine_trials, args.staged_samplers
    )
    if args.only:
        strategies = [s for s in strategies if s.name in args.only]
    if args.explain:
        return explain(land, base, strategies, args.seeds, args.slo)
    t0 = time.monotonic()
    result = replay(land, base, GROUPS, args.seeds, strategies, args.slo, say=print)
    result["reference"]["throughput_column"] = args.throughput
    result["reference"]["table"] = str(args.csv.relative_to(ROOT) if args.csv.is_absolute()
                                       and args.csv.is_relative_to(ROOT) else args.csv)  # fmt: skip
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result["reference"].items()}, default=str))
    (args.out / "replay_summary.md").write_text(markdown(result["summary"]) + "\n")
    (args.out / "landscape.md").write_text(markdown(result["landscape"]) + "\n")
    print(json.dumps(result["noise"]))
    print(markdown(result["landscape"]))
    print(markdown(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
