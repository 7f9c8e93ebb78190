"""`tuner run`: baseline, staged multi-objective search, acceptance, resume.

The storage layout (a baseline study per fingerprint, a study per stage, one for the
confirmations) is named by :mod:`tuner.schema`. Everything is derived from the storage on
start, so an interrupted run continues where it stopped and never re-runs a completed trial.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import optuna

from tuner.config import ParamSpec, TunerConfig
from tuner.errors import StudyFailedError
from tuner.executor import DEVICES_ATTR, Executor, JobResult, TrialFn, make_executor
from tuner.paths import StudyPaths
from tuner.quality import check_config
from tuner.schema import (
    EXPORT,
    REFINE,
    Role,
    StudyAttr,
    TrialAttr,
    baseline_study,
    confirm_label,
    confirm_study,
    stage_study,
)
from tuner.search.samplers import make_sampler
from tuner.server.kinds import served_by
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.evaluation import Evaluated, Evaluator
from tuner.study.decision.lead import FollowedLead, next_lead, other_configurations
from tuner.study.decision.stages import (
    Incumbent,
    Stage,
    StudyResult,
    after_decision,
    baseline_incumbent,
    jsonable,
    ok_trials,
)
from tuner.study.loop.budget import BudgetHook, LaunchBudget, modelled_extra, planned_launches
from tuner.study.loop.confirmation import Confirmation
from tuner.study.loop.failure_budget import FailureBudget
from tuner.study.loop.prescreen import Prescreen
from tuner.study.loop.running_trials import (
    PendingMeasurement,
    RunningTrial,
    RunningTrials,
    record_lost,
)
from tuner.study.loop.stage_search import SearchTools, StageSearch
from tuner.study.state.fingerprint import digest
from tuner.study.state.params_as_run import ParamsAsRun
from tuner.study.state.reference import QualityReference
from tuner.study.state.resume import check_resumed, open_study
from tuner.study.state.storage import open_storage
from tuner.study.state.stored_stage import StoredStage
from tuner.trial.run import run_trial

Progress = Callable[[str], None]
__all__ = ["Progress", "StudyRunner", "TrialFn"]  # TrialFn: the trial seam, tuner.executor's


def plan_stages(config: TunerConfig) -> list[Stage]:
    """Stages in the configured order; the joint strategy is one stage over every group.

    A group named again is searched again from the incumbent the groups between made (its
    second stage is ``<group>2``): where the best precision depends on the TP and the best TP on
    the precision, one pass fixes the first at a value the second made wrong. A staged study
    with ``refine_trials`` ends with a joint stage over every group, started from the staged
    incumbent: staging fixes each group at its winner while later groups are searched, which
    misses optima where parameters of two groups interact.
    """
    cfg, space = config.study, config.search_space
    names = [s for s in cfg.stages if s in space]
    union: dict[str, ParamSpec] = {p: spec for name in names for p, spec in space[name].items()}
    if cfg.strategy == "joint":
        return [Stage("joint", union, cfg.trials_per_stage)] if union else []
    passes: Counter[str] = Counter()
    stages = []
    for name in names:
        passes[name] += 1
        label = name if passes[name] == 1 else f"{name}{passes[name]}"
        stages.append(Stage(label, space[name], cfg.trials_per_stage))
    if cfg.refine_trials > 0 and len(stages) > 1:
        stages.append(Stage(REFINE, union, cfg.refine_trials))
    return stages


class StudyRunner:
    """Runs one study end to end against its storage."""

    def __init__(
        self,
        config: TunerConfig,
        evaluator: Evaluator,
        fingerprint: dict[str, Any],
        progress: Progress,
        rebaseline: bool = False,
        trial_fn: TrialFn = run_trial,
        on_launch: BudgetHook | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.trial_fn = trial_fn
        # Where trials run (study.executor); made at run() unless the session made it already
        self.executor = executor
        self.evaluator = evaluator
        self.fingerprint = fingerprint
        self.say = progress
        self.rebaseline = rebaseline
        self.paths = StudyPaths.for_study(config.studies_dir, config.name)
        self.stages = plan_stages(config)
        self.all_specs = {p: s for st in self.stages for p, s in st.specs.items()}
        self.as_run = ParamsAsRun(self.all_specs, config.server)
        self.budget = FailureBudget(config.study)
        first = config.study.baseline_measurements
        self.launches = LaunchBudget(planned_launches(config.study, self._stage_trials(0), first))
        # Without a display of its own, the budget is a plain progress line after each launch.
        self.on_launch: BudgetHook = on_launch or (lambda b: self.say(b.line()))
        check_config(config.quality)  # a bad quality set stops the study before any launch
        # The quality gate's reference: the baseline's outputs, kept in the storage with it
        self.quality = QualityReference(config, self.stages, self.paths, progress)
        self.baseline_ref: tuple[str, int] = ("", -1)  # (study, trial) of the baseline used
        self.done: list[StoredStage] = []  # finished stages, in order: their measurements reused
        # Checks of a candidate before its launch (vLLM's config, the estimator); attached by
        # Session.preflight, so a runner built without it (tests, replays) launches directly.
        self.prescreen: Prescreen | None = None
        self.confirmation = Confirmation(
            config, evaluator, self.optuna_study, self.measure_many, progress, self.add_launches
        )

    def reorder(self, groups: list[str]) -> None:
        """Runs the stages over ``groups`` in that order (one named twice is searched twice),
        chosen before the first launch (tuner.study.loop.order); the launch budget follows."""
        self.config.study.stages = list(groups)
        self.stages = plan_stages(self.config)
        first = self.config.study.baseline_measurements
        self.launches = LaunchBudget(
            planned_launches(self.config.study, self._stage_trials(0), first)
        )
        self.quality = QualityReference(self.config, self.stages, self.paths, self.say)

    def add_launches(self, count: int) -> None:
        self.launches.add(count)  # read at call time: measure_more replaces the budget

    @property
    def storage_url(self) -> str:
        return self.config.study.storage or self.paths.default_storage_url

    @property
    def exclusive(self) -> bool:
        """A SQLite file under the run lock has no other writer (see fail_unfinished_trials)."""
        return self.storage_url.startswith("sqlite")

    def storage_shown(self) -> str:
        """The storage URL with any password masked, for lines a user sees."""
        from tuner.study.state.storage import redact_url

        return redact_url(self.storage_url)

    # -- the run -----------------------------------------------------------------------
    def _open_run(self) -> None:
        """The storage (checked against the objectives it was run with), the executor and
        its flights, and the tools every stage search uses: what measuring anything of this
        study needs first."""
        self.paths.ensure()
        self.storage = open_storage(self.storage_url)
        check_resumed(self.storage, self.config.name, self.evaluator.names)
        self.executor = self.executor or make_executor(self.config, self.trial_fn, self.say)
        self.flights = RunningTrials(
            self.executor, self.config, self.storage, self.paths, self.all_specs, self.say
        )
        self.search = SearchTools(
            self.flights,
            self.land,
            self.tell,
            self.evaluator,
            self.as_run,
            self.config.server,
            self.config.study.reuse,
            self.prescreen,
            self.say,
            self.done,
        )

    def run(self) -> StudyResult:
        self._open_run()
        try:
            baseline = self._baseline()
            incumbent, decisions = baseline, []
            following = FollowedLead()  # a near miss the next stages search around
            for stage in self.stages:
                incumbent, decision = self._run_stage(stage, incumbent, following.lead)
                decisions.append(decision)
                self.say(decision.line())
                following.after(decision.accepted, partial(self._lead, stage, incumbent, decision))
        finally:
            self.close()
        pareto = {stored.name: stored.pareto_front() for stored in self.done}
        confidence = self.config.study.slo_confidence
        return StudyResult(baseline, incumbent, decisions, pareto, confidence)

    def measure_more(self, params: dict[str, Any], count: int) -> list[Evaluated]:
        """``count`` more windows of one configuration, each a trial as the study measures
        one, kept in its confirmation study as candidates (slots ``export/<n>``, after any
        earlier ones): what `tuner export --measure` adds to a chosen config's evidence."""
        self._open_run()
        self.launches = LaunchBudget(count)
        try:
            confirm = self.optuna_study(confirm_study(self.config.name))
            tags = [str(t.user_attrs.get(TrialAttr.CONFIRM_TAG, "")) for t in confirm.trials]
            first = sum(tag.startswith(f"{EXPORT}/") for tag in tags)
            wants = [
                PendingMeasurement(
                    confirm,
                    confirm_label(EXPORT),
                    params,
                    Role.CANDIDATE,
                    {TrialAttr.CONFIRM_TAG: f"{EXPORT}/{n}/{Role.CANDIDATE}"},
                    f"export: window {n - first + 1}/{count} of the chosen config",
                )
                for n in range(first, first + count)
            ]
            return self.measure_many(wants)
        finally:
            self.close()

    def close(self) -> None:
        """Release the executor (a local Ray instance shuts down); idempotent."""
        if self.executor is not None:
            self.executor.close()

    @property
    def parallel(self) -> bool:
        """Proposals are asked while other trials of their stage still run."""
        return self.executor is not None and self.executor.slots > 1

    def optuna_study(self, name: str, stage: Stage | None = None) -> optuna.Study:
        """The Optuna study ``name`` of this run's storage, opened or made (a stage's with its
        sampler): confirmations open theirs through it."""
        sampler = None
        if stage is not None:
            sampler = make_sampler(
                self.config.sampler, stage.specs, self.config.study.seed, parallel=self.parallel
            )
        return open_study(self.storage, name, self.evaluator, sampler, self.exclusive, self.say)

    # -- baseline ----------------------------------------------------------------------
    def _baseline(self) -> Incumbent:
        """The control, measured ``study.baseline_measurements`` times per fingerprint and way
        of scoring it (a stored value means what its objectives and prices made it)."""
        key = digest({**self.fingerprint, "scoring": self.evaluator.scoring()})
        study = self.optuna_study(baseline_study(key))
        study.set_user_attr(StudyAttr.FINGERPRINT, jsonable(self.fingerprint))
        want = self.config.study.baseline_measurements
        done = [] if self.rebaseline else ok_trials(study)[-want:]
        if done:
            numbers = ", ".join(str(t.number) for t in done)
            self.say(f"baseline {key}: reusing trial {numbers} (same fingerprint)")
            self.quality.reuse(done[-1])
        self.launches.replan(
            planned_launches(self.config.study, self._stage_trials(0), want - len(done))
        )
        if len(done) < want:  # side by side when the executor has the slots
            done = self._measure_baselines(study, key, len(done), want)
        self.baseline_ref = (study.study_name, done[-1].number)
        baseline = baseline_incumbent(done, self.evaluator.select_index)
        self.say(self.confirmation.learn_baseline(baseline, done))
        return baseline

    def _measure_baselines(
        self, study: optuna.Study, key: str, have: int, want: int
    ) -> list[optuna.trial.FrozenTrial]:
        served = served_by(self.config.server.kind)
        note = f"baseline {key}: measuring {served} with the fixed args only ({{}}/{want})"
        wants = [
            PendingMeasurement(study, Role.BASELINE, {}, Role.BASELINE, note=note.format(n + 1))
            for n in range(have, want)
        ]
        for result in self.measure_many(wants, stop=lambda r: not r.outcome.ok):
            if not result.outcome.ok:
                raise StudyFailedError(
                    f"the baseline failed ({result.outcome.reason}): {result.outcome.message}",
                    hint=f"fix the fixed server args; see {result.outcome.folder}",
                )
        return ok_trials(study)[-want:]  # every new one is ok, and the newest

    # -- one trial -----------------------------------------------------------------------
    def measure_many(
        self, wants: list[PendingMeasurement], stop: Callable[[Evaluated], bool] | None = None
    ) -> list[Evaluated]:
        """Each want measured and told, side by side as far as the executor has slots."""
        return self.flights.measure(wants, self.land, self.tell, stop)

    def land(self, flight: RunningTrial, result: JobResult) -> Evaluated | None:
        """A finished trial evaluated and recorded (not told); None when the executor lost it
        (recorded as failed: the caller measures again)."""
        want = flight.want
        if result.lost:
            record_lost(flight.trial, want, flight.prefix, result, self.say)
            return None
        # Launches in wall time: with N side by side, each adds 1/N of its duration.
        assert self.executor is not None
        slots = self.executor.slots
        extra = modelled_extra(result.outcome.server, slots)
        self.launches.finished((time.monotonic() - flight.started) / slots, extra)
        self.on_launch(self.launches)
        self.quality.score(result.outcome, want.label, want.role, flight.prefix)
        evaluated = self.evaluator.evaluate(result.outcome, want.params)
        quality = self.quality.attrs(want.role)
        evaluated.record(flight.trial, want.label, want.role, want.params, flight.launch, quality)
        if self.flights.parallel:
            flight.trial.set_user_attr(DEVICES_ATTR, result.devices.to_attr())
        return evaluated

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: Evaluated) -> None:
        # A failed server is told as an infeasible COMPLETE trial (with sentinel values and a
        # violated 'failed' constraint) so the sampler learns to avoid the region; a FAIL
        # state would be ignored by TPE.
        study.tell(trial, result.values)
        # after tell: the trial that trips the budget is stored
        self.budget.count(result.outcome.ok, result.outcome.reason)

    # -- stages --------------------------------------------------------------------------
    def _stage_trials(self, first: int) -> list[int]:
        return [s.trials for s in self.stages[first:]]

    def _run_stage(
        self, stage: Stage, incumbent: Incumbent, lead: Incumbent | None = None
    ) -> tuple[Incumbent, Decision]:
        """Search the stage around ``lead`` (else the incumbent), then decide against the
        incumbent (tuner.study.decision.lead); a stage decided already is only read back."""
        start = lead or incumbent
        rest = self._stage_trials(self.stages.index(stage))
        self.launches.replan(planned_launches(self.config.study, rest, 0))
        stored = StoredStage(
            self.optuna_study(stage_study(self.config.name, stage.name), stage), stage
        )
        stored.link_baseline(*self.baseline_ref)
        decision = stored.decision()
        if decision is not None:
            self.confirmation.learn(incumbent.params, decision)
        else:
            StageSearch(self.search, stored, start, self._following(stage)).run()
            decision = self.confirmation.decide(stored, incumbent, start.params)
            stored.keep_decision(decision)
        self.done.append(stored)
        return self._apply(decision, incumbent, stage), decision

    def _lead(self, stage: Stage, incumbent: Incumbent, decision: Decision) -> Incumbent | None:
        """A near miss of ``stage`` that beats the incumbent after it, for the next stages;
        else (study.prescreen) a trial the estimator puts ahead after the next stage."""
        following = self._following(stage)
        if following is None:
            return None
        select = (self.evaluator.select_index, self.evaluator.select_sign)
        stored, gain = self.done[-1], self.config.study.min_gain
        others = other_configurations(stored.search_trials(), incumbent, self.as_run)
        found = next_lead(others, incumbent, decision, select, gain, self.confirmation.pooled())
        if found is None and self.prescreen is not None:
            found = self.prescreen.lead_ahead(stored, following, incumbent, gain)
        if found is None:
            return None
        self.say(found[1])
        return found[0]

    def _following(self, stage: Stage) -> Stage | None:
        at = self.stages.index(stage)
        return self.stages[at + 1] if at + 1 < len(self.stages) else None

    def _apply(self, decision: Decision, incumbent: Incumbent, stage: Stage) -> Incumbent:
        return after_decision(incumbent, decision, self.evaluator.select_index, stage.name)
