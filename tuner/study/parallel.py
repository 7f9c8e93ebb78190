"""A stage's search with several trials at once (``study.parallel`` > 1, or any executor that
runs trials away from this process).

The driver still decides everything: proposals come from the stage's sampler through ask and
tell as in the serial loop, only several are asked before the first is told (TPE with its
constant liar, GP conditioning on the running trials: :mod:`tuner.search.samplers`). A proposal
starts when the executor has room for it. One that does not fit the free devices waits, and
another is asked for the devices it leaves idle; such younger ones may pass it only a bounded
number of times, so a large trial (TP 8) is not kept waiting forever by a stream of small ones
(benchmarks/executor_wall_time.py: packing the small ones around it instead of draining the
node for it left 14 % of an 8-GPU node's GPU-seconds idle instead of 25 % in a random TP
1/2/4/8 stage). A proposal of a point already asked waits for that measurement and reuses it.
A trial the executor lost is failed (not counted, not learnt from) and the stage asks for
another, so its budget of launches is still met.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from tuner.errors import StudyFailedError
from tuner.executor import REASON_EXECUTOR_LOST, TrialResult, demand_of
from tuner.schema import Role, TrialAttr, TrialStatus
from tuner.search import space as search_space
from tuner.study.evaluation import Evaluated
from tuner.study.flights import Flight, Flights, Want, record_lost
from tuner.study.stages import Incumbent, Stage, launched_trials, measured_point, point_key
from tuner.trial.outcome import TrialOutcome


class StageHost(Protocol):
    """What the stage loop uses of the runner (tuner.study.runner.StudyRunner)."""

    flights: Flights
    prescreen: Any
    all_specs: dict[str, Any]
    say: Any

    @property
    def reuses(self) -> bool: ...

    def _measured(
        self, study: optuna.Study, point: dict[str, Any], params: dict[str, Any]
    ) -> optuna.trial.FrozenTrial | None: ...

    def _reuse(
        self, study: optuna.Study, trial: optuna.Trial, seen: optuna.trial.FrozenTrial, stage: Stage
    ) -> None: ...

    def _stage_exhausted(self, study: optuna.Study, stage: Stage) -> bool: ...

    def _cover(
        self, study: optuna.Study, stage: Stage, launched: int, start: Incumbent
    ) -> None: ...

    def _land(self, flight: Flight, result: TrialResult) -> Evaluated | None: ...

    def _tell(self, study: optuna.Study, trial: optuna.Trial, result: Evaluated) -> None: ...

    def _say_best(self, study: optuna.Study, stage: Stage) -> None: ...


@dataclass
class _Proposal:
    trial: optuna.Trial
    point: dict[str, Any]
    params: dict[str, Any]


class ParallelStage:
    """One stage's search loop over an executor with several slots; see the module docstring."""

    def __init__(
        self, host: StageHost, study: optuna.Study, stage: Stage, incumbent: Incumbent
    ) -> None:
        self.host, self.study, self.stage, self.incumbent = host, study, stage, incumbent
        self.flights = host.flights
        self.ready: list[_Proposal] = []  # asked, waiting for room on the executor
        self.parked: list[_Proposal] = []  # a point in flight: waits for its measurement
        self.passed = 0  # trials started ahead of the oldest waiting proposal
        self.lost = 0
        self.asking = True

    def run(self) -> None:
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

    # -- asking ----------------------------------------------------------------------------
    def _fill(self) -> None:
        while True:
            self._start_ready()
            if not self._may_ask():
                return
            proposal = self._ask()
            if proposal is None:
                continue  # reused a measurement or refused before launch: ask again
            if self.host.reuses and point_key(proposal.point) in self._pending():
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
            if self.flights.fits(proposal.params):
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
        launched = len(launched_trials(self.study)) + active + len(self.ready)
        if launched >= self.stage.trials:
            return False
        if self.host._stage_exhausted(self.study, self.stage):
            self.asking = False
            return False
        self.host._cover(self.study, self.stage, launched, self.incumbent)
        return True

    def _ask(self) -> _Proposal | None:
        study, stage, host = self.study, self.stage, self.host
        trial = study.ask()
        point = search_space.suggest(trial, stage.specs)
        params = {**self.incumbent.params, **point}
        seen = host._measured(study, point, params) if host.reuses else None
        if seen is not None:
            host._reuse(study, trial, seen, stage)
            return None
        screen = host.prescreen
        if screen and screen.rejects(study, trial, stage, params, host.all_specs):
            return None  # told as infeasible, never launched
        return _Proposal(trial, point, params)

    def _start(self, proposal: _Proposal) -> None:
        # Counted as launches: a reused or refused proposal took no number.
        launched = len(launched_trials(self.study)) + len(self.flights.active)
        self.host.say(f"stage {self.stage.name}: trial {launched + 1}/{self.stage.trials}")
        want = Want(self.study, self.stage.name, proposal.params, Role.SEARCH)
        self.flights.start(want, proposal.trial)

    def _pending(self) -> set[str]:
        """The points asked and not measured yet: in flight or waiting to start."""
        mine = [f for f in self.flights.active.values() if f.want.study is self.study]
        return {point_key(f.trial.params) for f in mine} | {point_key(p.point) for p in self.ready}

    # -- landing ---------------------------------------------------------------------------
    def _landed(self, flight: Flight, result: TrialResult) -> None:
        evaluated = self.host._land(flight, result)
        if evaluated is None:  # lost (recorded failed by _land)
            self.lost += 1
            self._check_lost()
        else:
            self.host._tell(self.study, flight.trial, evaluated)
            self.host._say_best(self.study, self.stage)
        self._unpark()

    def _unpark(self) -> None:
        """Parked proposals whose point is measured now reuse it; one whose twin was lost
        is launched itself."""
        flying = self._pending()
        for proposal in list(self.parked):
            seen = measured_point(self.study, proposal.point)
            if seen is not None:
                self.host._reuse(self.study, proposal.trial, seen, self.stage)
            elif point_key(proposal.point) in flying:
                continue
            else:
                self.ready.append(proposal)
            self.parked.remove(proposal)

    def _unplaceable(self, proposal: _Proposal) -> None:
        """A proposal no alive node can hold now (nodes were lost): failed like a lost trial."""
        trial = proposal.trial
        want = Want(self.study, self.stage.name, proposal.params, Role.SEARCH)
        launch = self.flights.launch_of(proposal.params)
        demand = demand_of(self.flights.config, launch)
        outcome = TrialOutcome(f"{self.stage.name}-{trial.number}", TrialStatus.FAILED, [], launch)
        largest = self.flights.executor.largest_node().text()
        outcome.fail(
            REASON_EXECUTOR_LOST,
            f"needs {demand.text()} on one node; the largest node left has {largest}",
        )
        result = TrialResult("", outcome, lost="no node can hold it")
        record_lost(trial, want, f"[{self.stage.name} #{trial.number}]", result, self.host.say)
        self.lost += 1
        self._check_lost()

    def _check_lost(self) -> None:
        if self.lost > self.stage.trials:
            raise StudyFailedError(
                f"stage {self.stage.name}: the executor lost {self.lost} trials, more than "
                "the stage has",
                hint="check the Ray cluster's nodes (`ray status`); the study can be resumed",
            )

    def _drop(self, exc: BaseException) -> None:
        """Stop what runs; asked proposals that never started are failed, not left RUNNING."""
        if self.flights.active:
            self.flights.abandon(exc)
        for proposal in self.ready + self.parked:
            proposal.trial.set_user_attr(TrialAttr.INTERRUPTED, True)
            self.study.tell(proposal.trial, state=TrialState.FAIL)
        self.ready.clear()
        self.parked.clear()


def run_parallel_stage(
    host: StageHost, study: optuna.Study, stage: Stage, incumbent: Incumbent
) -> None:
    ParallelStage(host, study, stage, incumbent).run()
