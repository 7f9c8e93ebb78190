"""A stage's search: ask, reuse, screen, launch, land and tell, over any executor.

One loop serves every executor. The local executor is one with a single slot: a proposal is
asked, launched and told before the next is asked, as a study always ran. With more slots
(``study.parallel`` > 1, or Ray), the driver still decides everything: proposals come from the
stage's sampler through ask and tell, only several are asked before the first is told (TPE with
its constant liar, GP conditioning on the running trials: :mod:`tuner.search.samplers`).

A proposal starts when the executor has room for it. One that does not fit the free devices
waits, and another is asked for the devices it leaves idle; such younger ones may pass it only
a bounded number of times, so a large trial (TP 8) is not kept waiting forever by a stream of
small ones (benchmarks/executor_wall_time.py: packing the small ones around it instead of
draining the node for it left 14 % of an 8-GPU node's GPU-seconds idle instead of 25 % in a
random TP 1/2/4/8 stage). A proposal of a point already measured reuses that measurement; one
of a point in flight waits for it. A trial the executor lost is failed (not counted, not learnt
from) and the stage asks for another, so its budget of launches is still met.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config import ServerConfig
from tuner.executor import REASON_EXECUTOR_LOST, JobResult, demand_of
from tuner.schema import Role, TrialAttr, TrialStatus
from tuner.search import space as search_space
from tuner.search.resolved import ResolvedLaunch, resolve
from tuner.study.decision.evaluation import Evaluator
from tuner.study.decision.stages import Incumbent, Stage, point_key, stage_winner
from tuner.study.loop.prescreen import Prescreen
from tuner.study.loop.running_trials import (
    LostTrials,
    OnFinished,
    PendingMeasurement,
    RunningTrial,
    RunningTrials,
    Tell,
    record_lost,
)
from tuner.study.state.params_as_run import ParamsAsRun
from tuner.study.state.stored_stage import StoredStage, measured_config
from tuner.trial.outcome import TrialOutcome

MAX_PROPOSALS_PER_TRIAL = 4  # a stage that reuses measurements stops re-asking past this


@dataclass
class SearchTools:
    """What every stage's search uses of its study's run (the runner builds it once)."""

    flights: RunningTrials
    land: OnFinished  # a finished trial evaluated and recorded; None when the executor lost it
    tell: Tell
    evaluator: Evaluator
    as_run: ParamsAsRun
    server: ServerConfig
    reuse: bool  # study.reuse: a measured point or configuration is not launched again
    prescreen: Prescreen | None
    say: Callable[[str], None]
    earlier: list[StoredStage] = field(default_factory=list)  # finished stages, in order

    @property
    def specs(self) -> dict[str, Any]:
        """Every stage's param specs: how any of the study's params launch."""
        return self.flights.specs


@dataclass
class _Proposal:
    """A trial asked of the sampler and not started yet."""

    trial: optuna.Trial
    point: dict[str, Any]
    params: dict[str, Any]
    launch: ResolvedLaunch  # resolved when the point was suggested; run as it is


class StageSearch:
    """One stage's search from ``start`` until its budget of launches is spent; see the
    module's docstring. ``following``: the next stage, whose best points the prescreen's seeds
    are ranked by."""

    def __init__(
        self,
        tools: SearchTools,
        stored: StoredStage,
        start: Incumbent,
        following: Stage | None = None,
    ) -> None:
        self.tools, self.stored, self.start, self.following = tools, stored, start, following
        self.stage, self.study, self.flights = stored.stage, stored.study, tools.flights
        self.ready: list[_Proposal] = []  # asked, waiting for room on the executor
        self.parked: list[_Proposal] = []  # a point in flight: waits for its measurement
        self.passed = 0  # trials started ahead of the oldest waiting proposal
        self.lost = LostTrials(f"stage {self.stage.name}", self.stage.trials)
        self.asking = True

    def run(self) -> None:
        self._seed()
        try:
            while True:
                self._fill()
                if not self.flights.active:
                    if not self.ready:
                        return
                    self._unplaceable(self.ready.pop(0))
                    continue
                flight, result = self.flights.next()
                self._landed(flight, result)
        except BaseException as exc:
            self._drop(exc)
            raise

    def _seed(self) -> None:
        defaults = self.tools.as_run.defaults(self.start.params)
        if not self.stored.seed(self.start, self.tools.server, defaults):
            self.tools.say(
                f"stage {self.stage.name}: the incumbent runs vLLM's own default for some of "
                f"{', '.join(self.stage.specs)} (not a point of this space); the sampler starts "
                "without it"
            )

    # -- asking ----------------------------------------------------------------------------
    def _fill(self) -> None:
        while True:
            self._start_ready()
            if not self._may_ask():
                return
            proposal = self._ask()
            if proposal is None:
                continue  # reused a measurement or refused before launch: ask again
            if self.tools.reuse and point_key(proposal.point) in self._pending():
                self.parked.append(proposal)
            else:
                self.ready.append(proposal)

    def _start_ready(self) -> None:
        """Start the waiting proposals that fit, oldest first. A younger one may pass the
        oldest (devices free that it cannot use yet) at most ``slots`` times; then the oldest
        waits for its devices alone, so it cannot be passed over forever."""
        slots = self.flights.executor.slots
        for proposal in list(self.ready):
            if len(self.flights.active) >= slots:
                return
            oldest = proposal is self.ready[0]
            if not oldest and self.passed >= slots:
                return
            if self.flights.fits(proposal.launch):
                self.ready.remove(proposal)
                self._start(proposal)
                self.passed = 0 if oldest else self.passed + 1

    def _may_ask(self) -> bool:
        """Another proposal only while devices are free that no waiting one can use (so each
        is asked as late as possible, knowing the most), up to ``slots`` waiting."""
        slots = self.flights.executor.slots
        if not self.asking or self.parked or len(self.ready) >= slots:
            return False
        active = len(self.flights.active)
        if active >= slots or (self.ready and self.passed >= slots):
            return False
        launched = len(self.stored.launched()) + active + len(self.ready)
        if launched >= self.stage.trials:
            return False
        if self._exhausted():
            self.asking = False
            return False
        self._cover(launched)
        return True

    def _exhausted(self) -> bool:
        why = self.stored.exhausted(MAX_PROPOSALS_PER_TRIAL) if self.tools.reuse else ""
        if why:
            self.tools.say(f"stage {self.stage.name}: {why}")
        return bool(why)

    def _cover(self, launched: int) -> None:
        """The estimator's next seeds (study.prescreen; as many as trials run at once, which
        start knowing the same), or the points left once the stage's budget covers them."""
        screen = self.tools.prescreen
        if screen is not None:
            slots = self.flights.executor.slots
            screen.enqueue_best(self.stored, self.start, slots, self.following)
        if left := self.stored.queue_unmeasured(launched):
            self.tools.say(
                f"stage {self.stage.name}: its budget covers the {len(left)} point(s) not "
                "measured yet; measuring each"
            )

    def _ask(self) -> _Proposal | None:
        trial = self.study.ask()
        asked = search_space.suggest_launch(
            trial, self.stage.specs, self.start.params, self.tools.specs
        )
        point, params = asked.point, asked.params
        seen = self._measured(point, params) if self.tools.reuse else None
        if seen is not None:
            self._reuse(trial, seen)
            return None
        screen = self.tools.prescreen
        if screen and screen.rejects(self.stored, trial, params, self.tools.specs):
            return None  # told as infeasible, never launched
        return _Proposal(trial, point, params, resolve(asked.launch, self.tools.server))

    def _measured(
        self, point: dict[str, Any], params: dict[str, Any]
    ) -> optuna.trial.FrozenTrial | None:
        """This stage's trial at ``point``, or an earlier stage's of the same configuration."""
        return self.stored.measured(point) or measured_config(
            self.tools.earlier, params, self.tools.as_run
        )

    def _reuse(self, trial: optuna.Trial, seen: optuna.trial.FrozenTrial) -> None:
        self.stored.tell_reused(trial, seen)
        name = self.stage.name
        where = f"{seen.user_attrs.get(TrialAttr.STAGE, name)} trial {seen.number}"
        self.tools.say(f"stage {name}: trial {trial.number} repeats {where}: measurement reused")

    def _start(self, proposal: _Proposal) -> None:
        # Counted as launches: a reused or refused proposal took no number.
        launched = len(self.stored.launched()) + len(self.flights.active)
        self.tools.say(f"stage {self.stage.name}: trial {launched + 1}/{self.stage.trials}")
        name, params = self.stage.name, proposal.params
        want = PendingMeasurement(self.study, name, params, Role.SEARCH, launch=proposal.launch)
        self.flights.start(want, proposal.trial)

    def _pending(self) -> set[str]:
        """The points asked and not measured yet: in flight or waiting to start."""
        mine = [f for f in self.flights.active.values() if f.want.study is self.study]
        return {point_key(f.trial.params) for f in mine} | {point_key(p.point) for p in self.ready}

    # -- landing ---------------------------------------------------------------------------
    def _landed(self, flight: RunningTrial, result: JobResult) -> None:
        evaluated = self.tools.land(flight, result)
        if evaluated is None:  # lost (recorded failed by land): asked again by the sampler
            self.lost.lost(flight.want, flight.prefix, point_key(flight.trial.params))
        else:
            self.tools.tell(self.study, flight.trial, evaluated)
            self._say_best()
        self._unpark()

    def _say_best(self) -> None:
        evaluator = self.tools.evaluator
        idx, sign = evaluator.select_index, evaluator.select_sign
        if (best := stage_winner(self.stored.search_trials(), idx, sign)) is not None:
            by = f"{evaluator.select_by} {best.values[idx]:.4g}"
            self.tools.say(
                f"stage {self.stage.name}: best so far trial {best.number}: {by} {best.params}"
            )

    def _unpark(self) -> None:
        """Parked proposals whose point is measured now reuse it; one whose twin was lost
        is launched itself."""
        flying = self._pending()
        for proposal in list(self.parked):
            seen = self.stored.measured(proposal.point)
            if seen is not None:
                self._reuse(proposal.trial, seen)
            elif point_key(proposal.point) in flying:
                continue
            else:
                self.ready.append(proposal)
            self.parked.remove(proposal)

    def _unplaceable(self, proposal: _Proposal) -> None:
        """A proposal no alive node can hold now (nodes were lost): failed like a lost trial."""
        trial, name = proposal.trial, self.stage.name
        launch = proposal.launch
        want = PendingMeasurement(self.study, name, proposal.params, Role.SEARCH, launch=launch)
        demand = demand_of(self.flights.config, launch)
        outcome = TrialOutcome(f"{name}-{trial.number}", TrialStatus.FAILED, [], launch.spec)
        largest = self.flights.executor.largest_node().text()
        outcome.fail(
            REASON_EXECUTOR_LOST,
            f"needs {demand.text()} on one node; the largest node left has {largest}",
        )
        result = JobResult("", outcome, lost="no node can hold it")
        record_lost(trial, want, f"[{name} #{trial.number}]", result, self.tools.say)
        self.lost.lost(want, f"[{name} #{trial.number}]", point_key(proposal.point))

    def _drop(self, exc: BaseException) -> None:
        """Stop what runs; asked proposals that never started are failed, not left RUNNING."""
        if self.flights.active:
            self.flights.abandon(exc)
        for proposal in self.ready + self.parked:
            proposal.trial.set_user_attr(TrialAttr.INTERRUPTED, True)
            self.study.tell(proposal.trial, state=TrialState.FAIL)
        self.ready.clear()
        self.parked.clear()
