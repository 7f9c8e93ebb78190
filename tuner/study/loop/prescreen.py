"""What a study checks of a candidate before it launches one.

- Always (a real study, after ``Session.preflight``): vLLM builds its engine config from the
  candidate's flags in a warm worker (:mod:`tuner.plan.validate`). A refused candidate is told to
  Optuna as an infeasible trial, reason ``invalid_config`` with vLLM's message, and never
  launched: milliseconds instead of a server start that ends in the same error.
- With ``study.prescreen=true``: the GPU estimator (:mod:`tuner.plan`) says whether the candidate
  fits its GPUs; one that cannot start is told as infeasible too (``screened``), and the
  estimator's best points are queued as most of each stage's trials (:meth:`enqueue_best`),
  one at a time, each scaled by what the study measured so far, and first those whose best
  point in the next stage ranks first. After a stage, a trial whose best point over the next
  stage's params the estimator puts ahead of the incumbent's leads that stage
  (:meth:`lead_ahead`). Launched trials keep their estimate in their user attrs,
  beside the measurement that decides.

Neither counts as a launch: the stage's budget counts launched trials
(:meth:`tuner.study.state.stored_stage.StoredStage.launched`), the failure budget counts
failed launches.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config import TunerConfig
from tuner.errors import TunerError
from tuner.plan.baseline import baseline_fit
from tuner.plan.demand import over_host
from tuner.plan.estimate import PointEstimate
from tuner.plan.planner import Planner
from tuner.plan.points import modelled
from tuner.plan.table import TTFT_SLOPE, Anchor, PlannedPoint, Scale
from tuner.plan.validate import ConfigValidator, parser_defaults, validates
from tuner.schema import Role, TrialAttr, TrialStatus
from tuner.search import space as search_space
from tuner.search.launch import LaunchSpec
from tuner.search.space import as_spec
from tuner.study.decision.evaluation import Evaluator
from tuner.study.decision.lead import lead_incumbent
from tuner.study.decision.stages import Incumbent, Stage, measured_ok, point_key
from tuner.study.state.stored_stage import StoredStage
from tuner.trial.outcome import REASON_INVALID_CONFIG, REASON_SCREENED, TrialOutcome

Progress = Callable[[str], None]
MAX_ENQUEUED = 3  # of a stage's trials, at most this many come from the estimator
# How far over an SLO an anchored estimate may read and still count as meeting it when a stage
# looks ahead. A study's best point often sits on an SLO (that is what makes it the best), and
# an anchor carried from 64 sequences to 32 is off by about this much: judged strictly, the
# incumbent's best batch reads as a miss and a worse TP leads (the 70B H100 table).
LOOKAHEAD_TOLERANCE = 0.1
# A measured P99 this far from the estimated mean is no estimator bias (those are within ~2x
# against AIConfigurator's shipped vLLM runs) but a measurement gone wrong: no anchor then.
ANCHOR_RANGE = (0.2, 5.0)


# How the estimator orders points for the study's selection objective (lower first); any other
# objective is a rate of the whole server (throughput, goodput).
RANKS: dict[str, Callable[[PlannedPoint], float]] = {
    "cost_per_million_tokens": lambda p: _nan_last(p.cost_per_million),
    "energy_per_million_tokens": lambda p: _nan_last(p.cost_per_million),
    "p99_e2e_latency": lambda p: _nan_last(p.estimate.e2e_ms),
    "p99_ttft": lambda p: _nan_last(p.estimate.ttft_ms),
    "output_throughput_per_gpu": lambda p: _nan_last(-p.estimate.tokens_s_gpu),
    "output_throughput_per_user": lambda p: _nan_last(p.estimate.tpot_ms),
}


def rank_for(select_by: str) -> Callable[[PlannedPoint], float]:
    return RANKS.get(select_by, lambda p: _nan_last(-p.estimate.tokens_s))


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


class Prescreen:
    """Checks candidates of one study before launch; see the module's docstring."""

    def __init__(
        self,
        config: TunerConfig,
        evaluator: Evaluator,
        say: Progress,
        validator: ConfigValidator | None,
        planner: Planner | None = None,
        host_gpus: int = 0,
    ) -> None:
        self.config = config
        self.evaluator = evaluator
        self.say = say
        self.validator = validator
        self.planner = planner
        # The most GPUs one node offers a server (0: not known, or a CPU study): a candidate
        # that needs more is screened unlaunched
        self.host_gpus = host_gpus
        # The estimator where it is available although study.prescreen is off: it only checks
        # that the baseline fits (baseline_fit), and never screens or seeds a candidate
        self.fit_planner: Planner | None = planner

    @classmethod
    def open(
        cls, config: TunerConfig, evaluator: Evaluator, say: Progress, host_gpus: int = 0
    ) -> Prescreen:
        """vLLM's config check (its worker starts importing vLLM now), and the estimator when
        study.prescreen is on (a ConfigError, exit 2, if it cannot estimate this study)."""
        planner = Planner(config) if config.study.prescreen else None  # may refuse: exit 2
        validator = ConfigValidator(config.server) if validates(config.server) else None
        if validator is not None:
            validator.warm()
        if planner is not None:
            say(f"prescreen: candidates are estimated on {planner.describe()} before launch")
        screen = cls(config, evaluator, say, validator, planner, host_gpus)
        screen.fit_planner = planner or Planner.available(config)  # silent where none is
        if screen.fit_planner is not None and host_gpus:
            screen.fit_planner.host_gpus = host_gpus  # the executor's count: seeds fit it too
        return screen

    def baseline_fits(self) -> None:
        """With estimates, whether the fixed args fit their GPUs: one line naming the smallest
        TP (and precision) that does, exit 2, before any launch; silent without estimates."""
        if self.fit_planner is None:
            return
        try:
            baseline_fit(self.fit_planner, self.host_gpus)
        except TunerError:
            if self.validator is not None:  # its warm worker would outlive the refusal
                self.validator.close()
            raise

    def preflight(self) -> None:
        """The fixed args as vLLM builds its config: one line and exit 2 if it refuses them."""
        if self.validator is not None:
            self.validator.preflight(LaunchSpec())

    # -- one candidate ---------------------------------------------------------------------
    def rejects(
        self,
        stored: StoredStage,
        trial: optuna.Trial,
        params: dict[str, Any],
        specs: dict[str, Any],
    ) -> bool:
        """True when ``params`` must not launch; the trial is then told (infeasible)."""
        stage = stored.stage
        launch = search_space.to_launch(params, specs)
        started = time.monotonic()
        why = self._too_many_gpus(params) or self._invalid(launch) or self._screened(trial, params)
        if why is None:
            return False
        reason, message = why
        argv = self.validator.request(launch)[0] if self.validator else []  # what would have run
        outcome = TrialOutcome(f"{stage.name}-{trial.number}", TrialStatus.FAILED, argv, launch)
        outcome.fail(reason, message)
        outcome.timings = {"prescreen": round(time.monotonic() - started, 4)}
        result = self.evaluator.evaluate(outcome, params)
        result.record(trial, stage.name, Role.SEARCH, params, launch)
        stored.study.tell(trial, result.values)
        self.say(f"stage {stage.name}: trial {trial.number} not launched ({reason}): {message}")
        return True

    def _too_many_gpus(self, params: dict[str, Any]) -> tuple[str, str] | None:
        """A candidate whose TP x PP x DP exceeds the largest node's GPUs: it could never
        start (vLLM fails, Ray waits forever), so it is screened without a launch."""
        why = over_host(self.config, params, self.host_gpus)
        return None if why is None else (REASON_SCREENED, why)

    def _invalid(self, launch: LaunchSpec) -> tuple[str, str] | None:
        if self.validator is None:
            return None
        try:
            rejected = self.validator.check(launch)
        except TunerError as exc:  # the worker broke: launch unchecked rather than stop
            self.say(f"vLLM's config check is off for this run: {exc.one_line()}")
            self.validator = None
            return None
        return None if rejected is None else (REASON_INVALID_CONFIG, rejected.line())

    def server_values(self, params: dict[str, Any], specs: dict[str, Any]) -> dict[str, Any]:
        """What vLLM's config holds for each param of ``specs`` when launched with ``params``:
        a param left out reads as vLLM's default for that launch; without the config check,
        as the parser's default where it has one (:func:`parser_defaults`)."""
        names = {p: as_spec(s, p).name or p for p, s in specs.items()}
        wanted = [n for p, n in names.items() if as_spec(specs[p], p).target == "arg"]
        if self.validator is None:
            found = parser_defaults(self.config.server.python or sys.executable)
            return {p: found[n] for p, n in names.items() if n in wanted and n in found}
        try:
            found = self.validator.values(search_space.to_launch(params, specs), wanted)
        except TunerError as exc:  # the worker broke: launch unchecked rather than stop
            self.say(f"vLLM's config check is off for this run: {exc.one_line()}")
            self.validator = None
            return {}
        return {p: found[n] for p, n in names.items() if n in found}

    def _screened(self, trial: optuna.Trial, params: dict[str, Any]) -> tuple[str, str] | None:
        if self.planner is None:
            return None
        estimate = self.planner.estimate(params)
        for key, value in estimate.attrs(self.planner.system).items():
            trial.set_user_attr(key, value)
        if estimate.starts:
            return None
        return REASON_SCREENED, f"estimated not to fit on {self.planner.system}: {estimate.note}"

    # -- a stage's seeds ---------------------------------------------------------------------
    def anchor(self, incumbent: Incumbent, stored: StoredStage | None = None) -> Anchor:
        """Measured P99s over estimated means (:class:`Scale` per latency), fitted on the
        incumbent's measurement and the launches of ``stored`` (a stage around the incumbent).
        A ratio beyond :data:`ANCHOR_RANGE` is a failed measurement rather than a bias and
        anchors nothing; with no measurement left an estimate is taken as it is."""
        if self.planner is None:
            return Anchor()
        seen = [(incumbent.params, incumbent.constraints)]
        if stored is not None:
            trials = [t for t in stored.launched() if measured_ok(t)]
            seen += [({**incumbent.params, **t.params}, t.constraints) for t in trials]
        samples: dict[str, list[tuple[float, float]]] = {"ttft": [], "tpot": [], "e2e": []}
        for params, constraints in seen:
            e = self.planner.estimate(params)
            for name, factor in self._factors(e, constraints).items():
                samples[name].append((e.point.batch, factor))
        return Anchor(
            ttft=Scale.fit(samples["ttft"], TTFT_SLOPE),  # its slope is known before a launch
            tpot=Scale.fit(samples["tpot"]),
            e2e=Scale.fit(samples["e2e"]),
        )

    def _factors(self, e: PointEstimate, constraints: dict[str, float]) -> dict[str, float]:
        slo = self.config.slo
        latencies = {
            "ttft": (slo.p99_ttft_s, e.ttft_ms),
            "tpot": (slo.p99_tpot_s, e.tpot_ms),
            "e2e": (slo.p99_e2e_s, e.e2e_ms),
        }
        factors = {}
        for name, (limit, estimated_ms) in latencies.items():
            overshoot = constraints.get(f"slo_p99_{name}")
            if limit <= 0 or overshoot is None or not estimated_ms > 0:  # NaN is not > 0
                continue
            factor = limit * (1 + overshoot) / (estimated_ms / 1000)  # measured P99 / estimate
            if ANCHOR_RANGE[0] <= factor <= ANCHOR_RANGE[1]:
                factors[name] = factor
        return factors

    def enqueue_best(
        self,
        stored: StoredStage,
        incumbent: Incumbent,
        at_once: int = 1,
        following: Stage | None = None,
    ) -> int:
        """Queue the estimator's best points not measured yet as the stage's next trials, up
        to ``at_once`` and :func:`seeds_for` the stage in all: those that start, the ones
        whose estimates (anchored on what the study measured) meet the SLOs first, then the
        nearest to meeting them, each by the selection objective. One at a time, each seed
        is chosen knowing how the last one measured against its estimate.

        With a ``following`` stage the estimator can judge, points are first ordered by their
        best point there (as :meth:`lead_ahead` judges them after the stage): at the
        incumbent's batch every TP may miss the SLOs, and the one that misses by least is
        often not the one that serves most at the batch that meets them. Seeding by the miss
        measures the wrong TP, and with one launch a stage the right one is never measured."""
        study, stage = stored.study, stored.stage
        kept = modelled(stage.specs)[0]
        if self.planner is None or not kept:
            return 0  # no estimator, or nothing it tells apart
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return 0  # the queue's points go first
        wanted = min(at_once, seeds_for(stage) - len(seeded_trials(study)))
        if wanted <= 0:
            return 0
        points, _, _ = self.planner.space(stage.specs, incumbent.params)
        trials = study.get_trials(deepcopy=False)  # a point is its modelled params here
        taken = {point_key({p: t.params[p] for p in kept if p in t.params}) for t in trials}
        rank = rank_for(self.evaluator.select_by)
        anchor = self.anchor(incumbent, stored)
        starts = [p for p in points if p.estimate.starts and point_key(p.params) not in taken]
        ahead = self._ahead_rank(following, incumbent.params, anchor)
        starts.sort(key=lambda p: (ahead(p), p.overshoot(self.config.slo, anchor), rank(p)))
        best = [p.params for p in starts[:wanted]]
        for point in best:
            study.enqueue_trial(point, user_attrs={TrialAttr.SEEDED: True}, skip_if_exists=True)
        if best:
            self.say(f"stage {stage.name}: next trial(s) from the estimator: {best}")
        return len(best)

    def lead_ahead(
        self,
        stored: StoredStage,
        following: Stage,
        incumbent: Incumbent,
        min_gain: float,
    ) -> tuple[Incumbent, str] | None:
        """A lead for the ``following`` stage that no window shows: the trial of ``stage``
        whose best point over the following stage's params, estimated and anchored on what the
        stage measured, beats the incumbent's best point there by more than ``min_gain`` (with
        the line that says so), or None. A best point is the one that ranks first of those
        within :data:`LOOKAHEAD_TOLERANCE` of the SLOs.

        A stage measures its group at the incumbent's other params: a smaller TP that misses
        the SLOs at the incumbent's batch, and by more than a larger one, can meet them at a
        smaller batch and serve more tokens per GPU there. Staged search keeps the larger TP
        and the next stage never sees the pair; the estimator ranks such completions well
        (:mod:`tuner.plan.fidelity`)."""
        stage = stored.stage
        anchor = self.anchor(incumbent, stored)
        if not self._ahead(following, anchor):
            return None
        rank = rank_for(self.evaluator.select_by)
        mine = self._best_after(following, incumbent.params, anchor)
        own = {p: incumbent.params.get(p) for p in stage.specs}
        ahead = []
        for trial in stored.search_trials():
            if not measured_ok(trial) or {p: trial.params.get(p) for p in own} == own:
                continue
            best = self._best_after(following, {**incumbent.params, **trial.params}, anchor)
            if best is not None:
                ahead.append((rank(best), trial, best))
        if not ahead:
            return None
        score, trial, best = min(ahead, key=lambda a: a[0])
        gain = 1.0 if mine is None else (rank(mine) - score) / max(abs(rank(mine)), 1e-12)
        if gain <= min_gain:
            return None
        select = self.evaluator.select_index
        lead = lead_incumbent(trial, incumbent, stage.name, select, trial.constraints)
        than = "the incumbent has none" if mine is None else f"{gain:+.1%} over the incumbent's"
        line = (
            f"stage {stage.name}: trial {trial.number} {trial.params} leads stage "
            f"{following.name}: the estimator's best point there is {best.params} ({than}); "
            "the incumbent stays unless a feasible winner beats it"
        )
        return lead, line

    def _ahead_rank(
        self, following: Stage | None, params: dict[str, Any], anchor: Anchor
    ) -> Callable[[PlannedPoint], float]:
        """A point's rank by its best point in ``following`` (no such point last); one rank
        for every point where the following stage cannot be judged."""
        if following is None or not self._ahead(following, anchor):
            return lambda _: 0.0
        rank = rank_for(self.evaluator.select_by)

        def ahead(point: PlannedPoint) -> float:
            best = self._best_after(following, {**params, **point.params}, anchor)
            return math.inf if best is None else rank(best)

        return ahead

    def _ahead(self, following: Stage, anchor: Anchor) -> bool:
        """Whether a point can be judged by the following stage's: the estimator models that
        stage's params, and a measurement anchors each latency the SLOs bound."""
        return (
            self.planner is not None
            and bool(modelled(following.specs)[0])
            and anchor.covers(self.config.slo)
        )

    def _best_after(
        self, following: Stage, params: dict[str, Any], anchor: Anchor
    ) -> PlannedPoint | None:
        """The following stage's point around ``params`` that ranks first by the selection
        objective of those whose anchored estimates are within :data:`LOOKAHEAD_TOLERANCE` of
        the SLOs; None if no point is."""
        assert self.planner is not None
        points, _, _ = self.planner.space(following.specs, params)
        slo, within = self.config.slo, LOOKAHEAD_TOLERANCE
        meets = [p for p in points if p.overshoot(slo, anchor) <= within]
        return min(meets, key=rank_for(self.evaluator.select_by), default=None)


def seeds_for(stage: Stage) -> int:
    """How many of a stage's trials the estimator chooses: all but one (the sampler's), at
    most :data:`MAX_ENQUEUED`, at least one."""
    return max(1, min(MAX_ENQUEUED, stage.trials - 1))


def seeded_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(TrialAttr.SEEDED)]
