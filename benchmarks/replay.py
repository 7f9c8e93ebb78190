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
import csv
import itertools
import json
import logging
import math
import statistics
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
from optuna._hypervolume import compute_hypervolume  # noqa: E402

import tuner.study as study_module  # noqa: E402
from tuner.acceptance import Decision  # noqa: E402
from tuner.cli import compose  # noqa: E402
from tuner.config import ParamSpec, SamplerConfig, TunerConfig  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.evaluation import Evaluator  # noqa: E402
from tuner.measure import Measurements, MetricStats  # noqa: E402
from tuner.server import LaunchSpec  # noqa: E402
from tuner.study import TrialFn  # noqa: E402
from tuner.trial import TrialOutcome  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "data" / "grid_vllm_cpu.csv"
DEFAULT_OUT = ROOT / "benchmarks" / "results"
TARGET = 0.97
HV_AT = (5, 10, 20)
MAX_ERROR_RATE = 0.01
WINDOW_S = 10.0  # the grid's window: only used to rebuild counts from rates
Key = tuple[Any, ...]
# The study's SQLite file: in memory-backed /dev/shm when there is one (a commit there costs
# microseconds; on a busy disk each of a run's ~1,000 commits waited ~15 ms for fsync).
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None


# ---- the table --------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """CSV cell -> None (empty: the flag was left out), bool, int, float or str."""
    if text in ("", "None"):
        return None
    if text in ("True", "true", "False", "false"):
        return text in ("True", "true")
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _num(text: str) -> float | None:
    return None if text in ("", "None") else float(text)


@dataclass(frozen=True)
class Measured:
    """One measurement of one configuration (a row of the table)."""

    ok: bool
    reason: str
    p50_e2e_s: float | None
    p99_e2e_s: float | None
    p50_ttft_s: float | None
    p99_ttft_s: float | None
    p50_tpot_s: float | None
    p99_tpot_s: float | None
    output_tok_s: float
    request_per_s: float
    error_rate: float
    completed: int
    failed: int

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> Measured:
        num = {k: _num(row.get(k, "")) for k in _METRIC_COLUMNS}
        ok = row.get("status") == "ok" and num["p99_e2e_s"] is not None
        return cls(
            ok=ok,
            reason=row.get("reason", "") or ("" if ok else "failed"),
            **{k: num[k] for k in _METRIC_COLUMNS[:6]},
            output_tok_s=num["output_tok_s"] or 0.0,
            request_per_s=num["request_per_s"] or 0.0,
            error_rate=num["error_rate"] if num["error_rate"] is not None else 1.0,
            completed=int(num["completed"] or 0),
            failed=int(num["failed"] or 0),
        )


_METRIC_COLUMNS = (
    "p50_e2e_s", "p99_e2e_s", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s",
    "output_tok_s", "request_per_s", "error_rate", "completed", "failed",
)  # fmt: skip


@dataclass(frozen=True)
class Truth:
    """A configuration's value: the mean over its repeats; infeasible if any repeat failed."""

    ok: bool
    p99_e2e_s: float
    output_tok_s: float
    error_rate: float

    def feasible(self, slo_p99_e2e_s: float) -> bool:
        return self.ok and self.p99_e2e_s <= slo_p99_e2e_s and self.error_rate <= MAX_ERROR_RATE


class Landscape:
    """Measured configurations: ``{key: [repeats]}``, a key being the params in order."""

    def __init__(
        self,
        params: Sequence[str],
        table: Mapping[Key, list[Measured]],
        defaults: Mapping[str, Any],
    ) -> None:
        self.params = list(params)
        self.table = dict(table)
        self.defaults = dict(defaults)  # a param a launch leaves out takes this value

    @classmethod
    def from_csv(cls, path: Path, params: Sequence[str], defaults: Mapping[str, Any]) -> Landscape:
        table: dict[Key, list[Measured]] = {}
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                key = tuple(parse_value(row[p]) for p in params)
                table.setdefault(key, []).append(Measured.from_row(row))
        return cls(params, table, defaults)

    def key(self, args: Mapping[str, Any]) -> Key:
        return tuple(args[p] if p in args else self.defaults.get(p) for p in self.params)

    def params_of(self, key: Key) -> dict[str, Any]:
        return dict(zip(self.params, key, strict=True))

    def draw(self, key: Key, rng: np.random.Generator) -> Measured:
        if key not in self.table:
            raise KeyError(f"configuration {self.params_of(key)} is not in the table")
        repeats = self.table[key]
        return repeats[int(rng.integers(len(repeats)))]

    def truth(self, key: Key) -> Truth:
        reps = self.table[key]
        if not all(r.ok for r in reps):
            return Truth(False, math.inf, 0.0, 1.0)
        return Truth(
            True,
            float(np.mean([r.p99_e2e_s or 0.0 for r in reps])),
            float(np.mean([r.output_tok_s for r in reps])),
            float(np.mean([r.error_rate for r in reps])),
        )

    def values(self) -> dict[str, list[Any]]:
        """Every explicit value of every param, ascending (the grid's axes)."""
        axes: dict[str, set[Any]] = {p: set() for p in self.params}
        for key in self.table:
            for p, v in zip(self.params, key, strict=True):
                if v is not None:
                    axes[p].add(v)
        return {p: sorted(vals, key=lambda v: (str(type(v)), v)) for p, vals in axes.items()}

    def grid_keys(self) -> list[Key]:
        """The full grid in nested order (first param outermost), as vLLM's auto_tune walks it."""
        keys = [tuple(k) for k in itertools.product(*self.values().values())]
        return [k for k in keys if k in self.table]


# ---- the reference: SLO, best feasible, grid hypervolume -----------------------------------
@dataclass
class Reference:
    slo_p99_e2e_s: float
    best_key: Key
    best_value: float
    feasible_share: float
    hv_grid: float
    ref_point: tuple[float, float]


def median_slo(land: Landscape) -> float:
    """The median true P99 E2E over the grid's configurations that ran: ~half are feasible."""
    p99 = [t.p99_e2e_s for k in land.grid_keys() if (t := land.truth(k)).ok]
    return float(np.median(p99))


def reference(land: Landscape, slo: float) -> Reference:
    grid = land.grid_keys()
    feasible = [k for k in grid if land.truth(k).feasible(slo)]
    if not feasible:
        raise SystemExit(f"no configuration of the grid meets P99 E2E <= {slo:.3f} s")
    best = max(feasible, key=lambda k: land.truth(k).output_tok_s)
    ok = [land.truth(k) for k in land.table if land.truth(k).ok]
    ref = (1.1 * max(t.p99_e2e_s for t in ok), 0.0)  # (worst latency + 10 %, zero throughput)
    share = len(feasible) / len(grid)
    hv = hypervolume([land.truth(k) for k in grid], ref)
    return Reference(slo, best, land.truth(best).output_tok_s, share, hv, ref)


def hypervolume(points: Sequence[Truth], ref: tuple[float, float]) -> float:
    """HV of (P99 E2E min, output tok/s max) with optuna's exact calculator (as losses)."""
    ok = [p for p in points if p.ok]
    if not ok:
        return 0.0
    losses = np.array([[p.p99_e2e_s, -p.output_tok_s] for p in ok])
    return float(compute_hypervolume(losses, np.array([ref[0], -ref[1]])))


def _spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean of the repeats; None with fewer than two."""
    return (
        round((max(values) - min(values)) / float(np.mean(values)), 3) if len(values) > 1 else None
    )


def landscape_rows(land: Landscape, slo: float) -> list[dict[str, Any]]:
    """Every configuration's truth and its repeat-to-repeat spread, best first."""
    rows = []
    for key, reps in land.table.items():
        t = land.truth(key)
        tok = [r.output_tok_s for r in reps if r.ok]
        p99 = [r.p99_e2e_s or 0.0 for r in reps if r.ok]
        rows.append({
            **{p: ("default" if v is None else v) for p, v in land.params_of(key).items()},
            "repeats": len(reps), "failed": sum(not r.ok for r in reps),
            "output_tok_s": round(t.output_tok_s, 1), "p99_e2e_s": round(t.p99_e2e_s, 3),
            "feasible": t.feasible(slo),
            "tok_s_spread": _spread(tok), "p99_spread": _spread(p99),
        })  # fmt: skip
    return sorted(rows, key=lambda r: -r["output_tok_s"])


# ---- a run ------------------------------------------------------------------------------
@dataclass
class Launch:
    label: str  # baseline, <stage>, <stage>-confirm, grid, defaults
    key: Key
    observed: Measured


@dataclass
class RunTrace:
    """Launches in order and the selection after each (None: nothing feasible yet)."""

    strategy: str
    seed: int
    launches: list[Launch] = field(default_factory=list)
    selected: list[Key | None] = field(default_factory=list)
    stopped: str = ""  # why a StudyRunner run ended early (TunerError), if it did
    independent_samples: int = 0  # params a relative sampler drew independently (fell back)


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


def best_observed(launches: Sequence[Launch], land: Landscape, slo: float) -> list[Key | None]:
    """After each launch: the best feasible launch so far by its *observed* values."""
    out: list[Key | None] = []
    best: tuple[float, Key] | None = None
    for launch in launches:
        o = launch.observed
        feasible = o.ok and (o.p99_e2e_s or math.inf) <= slo and o.error_rate <= MAX_ERROR_RATE
        if feasible and (best is None or o.output_tok_s > best[0]):
            best = (o.output_tok_s, launch.key)
        out.append(best[1] if best else None)
    return out


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
        if study_module.ATTR_DECISION in st.user_attrs:
            out.append(Decision.from_dict(st.user_attrs[study_module.ATTR_DECISION]))
    return out


def incumbent_timeline(
    launches: Sequence[Launch], decisions: Sequence[Decision], land: Landscape
) -> list[Key | None]:
    """After each launch, the incumbent the study would hand over (accepted decisions only)."""
    ends = {}
    for i, launch in enumerate(launches):
        ends[launch.label.removesuffix("-confirm")] = i
    changes = {ends[d.stage]: d for d in decisions if d.stage in ends}
    current: dict[str, Any] = {}
    out: list[Key | None] = []
    for i, _ in enumerate(launches):
        if i in changes and changes[i].accepted:
            current = dict(changes[i].candidate_params)
        out.append(land.key(current))
    return out


# ---- scoring ----------------------------------------------------------------------------
def score(land: Landscape, ref: Reference, key: Key | None) -> float:
    if key is None:
        return 0.0
    t = land.truth(key)
    return t.output_tok_s / ref.best_value if t.feasible(ref.slo_p99_e2e_s) else 0.0


def first_reaching(scores: Sequence[float]) -> int | None:
    return next((i + 1 for i, s in enumerate(scores) if s >= TARGET - 1e-12), None)


def summarize_run(trace: RunTrace, land: Landscape, ref: Reference) -> dict[str, Any]:
    scores = [score(land, ref, k) for k in trace.selected]
    reached = first_reaching(scores)
    # The best launch seen so far (no acceptance step): the sampler's search efficiency alone.
    seen = [score(land, ref, k) for k in best_observed(trace.launches, land, ref.slo_p99_e2e_s)]
    last = trace.selected[-1] if trace.selected else None
    row: dict[str, Any] = {
        "strategy": trace.strategy,
        "seed": trace.seed,
        "launches": len(trace.launches),
        "trials_to_97": reached,
        "trials_to_97_seen": first_reaching(seen),
        "final_score": round(scores[-1], 4) if scores else 0.0,
        "final_config": None if last is None else land.params_of(last),
        "distinct_configs": len({launch.key for launch in trace.launches}),
        "failed_launches": sum(not launch.observed.ok for launch in trace.launches),
        "stopped": trace.stopped,
        "independent_samples": trace.independent_samples,
    }
    for t in HV_AT:
        launched = {launch.key for launch in trace.launches[:t]}
        hv = hypervolume([land.truth(k) for k in launched], ref.ref_point)
        row[f"hv_at_{t}"] = round(hv / ref.hv_grid, 4)
    return row


def _median_trials(rows: Sequence[dict[str, Any]], key: str) -> float:
    """Median over seeds; a seed that never reached 97 % counts as infinitely many trials."""
    return statistics.median(math.inf if r[key] is None else r[key] for r in rows)


def aggregate(rows: Sequence[dict[str, Any]], grid_size: int) -> list[dict[str, Any]]:
    """One line per strategy: medians over seeds."""
    out = []
    for name in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == name]
        reached = [r["trials_to_97"] for r in mine if r["trials_to_97"] is not None]
        med, med_seen = (
            _median_trials(mine, "trials_to_97"),
            _median_trials(mine, "trials_to_97_seen"),
        )
        line: dict[str, Any] = {
            "strategy": name,
            "seeds": len(mine),
            "reached_97": f"{len(reached)}/{len(mine)}",
            "median_trials_to_97": med if math.isfinite(med) else None,
            "median_trials_to_97_pct_of_grid": round(100 * med / grid_size, 1)
            if math.isfinite(med) else None,
            "median_trials_to_97_seen": med_seen if math.isfinite(med_seen) else None,
            "median_final_score": round(statistics.median(r["final_score"] for r in mine), 4),
            "median_launches": statistics.median(r["launches"] for r in mine),
            "independent_samples": statistics.median(r["independent_samples"] for r in mine),
        }  # fmt: skip
        for t in HV_AT:
            line[f"median_hv_at_{t}"] = round(statistics.median(r[f"hv_at_{t}"] for r in mine), 4)
        out.append(line)
    return out


# ---- the benchmark -----------------------------------------------------------------------
def default_strategies(
    joint_trials: int, staged_trials: Sequence[int], refine_trials: int
) -> list[StudyStrategy]:
    """Tuner's staged TPE at each stage budget (with and without the final joint refinement),
    and every sampler over the joint space."""
    staged = [StudyStrategy(f"staged_tpe_{n}", "staged", "tpe", n) for n in staged_trials]
    if refine_trials:
        staged += [StudyStrategy(f"staged_tpe_{n}_refine_{refine_trials}", "staged", "tpe", n,
                                 refine_trials=refine_trials) for n in staged_trials]  # fmt: skip
    return [
        *staged,
        StudyStrategy("joint_tpe", "joint", "tpe", joint_trials),
        StudyStrategy("joint_gp", "joint", "gp", joint_trials),
        # population 6: four generations in 20 trials (conf/sampler/nsga2.yaml explains why).
        StudyStrategy("joint_nsga2", "joint", "nsga2", joint_trials, 2, 0, {"population_size": 6}),
        StudyStrategy("joint_random", "joint", "random", joint_trials, 2, 0),
    ]


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


def base_config() -> TunerConfig:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # StudyRunner records heartbeats around ask/tell trials on purpose (tuner/storage.py).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    return compose([])


def markdown(summary: Sequence[dict[str, Any]]) -> str:
    cols = list(summary[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |"
              for r in summary]  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--slo", type=float, default=None, help="P99 E2E SLO (s); default: median")
    p.add_argument("--joint-trials", type=int, default=20)
    p.add_argument(
        "--staged-trials",
        type=int,
        nargs="+",
        default=[4, 8],
        help="study.trials_per_stage of the staged runs (one strategy per value)",
    )
    p.add_argument("--refine-trials", type=int, default=4, help="study.refine_trials; 0: none")
    p.add_argument("--only", nargs="+", default=None, help="run only these StudyRunner strategies")
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
    land = Landscape.from_csv(args.csv, params, defaults)
    strategies = default_strategies(args.joint_trials, args.staged_trials, args.refine_trials)
    if args.only:
        strategies = [s for s in strategies if s.name in args.only]
    t0 = time.monotonic()
    result = replay(land, base, GROUPS, args.seeds, strategies, args.slo, say=print)
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
