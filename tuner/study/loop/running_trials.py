"""The trials a study has on its executor: asked, submitted, heartbeating, and landed.

The runner decides what to measure; this module carries each measurement through the executor
(:mod:`tuner.executor`): a :class:`PendingMeasurement` is asked from its Optuna study when a
slot is free, its launch submitted, its storage heartbeat kept while it runs, and its result
handed back to the runner's ``land`` (evaluate, record) and ``tell``. With the local executor
that is one trial at a time, in order, as a study always ran; with more slots, trials of a
batch run side by side.

Whatever stops a run (an interrupt, an error, a spent failure budget) stops every trial in
flight first and marks each failed, so none stays RUNNING in the storage; a job the executor
lost is recorded as failed (``executor_lost``) and measured again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config import TunerConfig
from tuner.errors import StudyFailedError
from tuner.executor import DEVICES_ATTR, Executor, JobResult, TrialJob, demand_of
from tuner.loadgen import client_capacity
from tuner.paths import StudyPaths
from tuner.schema import TrialAttr, TrialStatus
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import ResolvedLaunch, resolve_params
from tuner.study.decision.evaluation import Evaluated
from tuner.study.state.storage import Heartbeat, trial_id

MAX_LOST_PER_WANT = 3  # a measurement lost this often is not the executor's bad luck
HINT_LOST = "check the Ray cluster's nodes (`ray status`); the study can be resumed"


@dataclass
class PendingMeasurement:
    """One measurement the runner wants, asked from ``study`` when a slot is free."""

    study: optuna.Study
    label: str
    params: dict[str, Any]
    role: str
    attrs: dict[str, Any] = field(default_factory=dict)  # set on the trial once asked
    note: str = ""  # said when it starts
    # the launch, where it was resolved when the point was suggested (a stage's search);
    # None: a measurement of stored params (baselines, confirmations), resolved as it starts
    launch: ResolvedLaunch | None = None


@dataclass
class RunningTrial:
    """A trial on the executor."""

    want: PendingMeasurement
    trial: optuna.Trial
    launch: LaunchSpec
    job: TrialJob
    heartbeat: Heartbeat
    started: float = field(default_factory=time.monotonic)

    @property
    def prefix(self) -> str:
        return self.job.prefix


OnFinished = Callable[[RunningTrial, JobResult], Evaluated | None]  # None: the executor lost it


@dataclass
class LostTrials:
    """The one rule for trials the executor lost, wherever a study measures (a stage's search,
    its baselines, confirmations and repeats, export's windows): each was recorded failed by
    ``land`` (:func:`record_lost`) and is measured again, until one measurement has been lost
    :data:`MAX_LOST_PER_WANT` times or the run has lost more than ``budget`` trials: then the
    executor, not its luck, is at fault and the study stops (it can be resumed)."""

    what: str  # the run, in words: "stage batching", "baseline"
    budget: int
    total: int = 0
    times: dict[Hashable, int] = field(default_factory=dict)

    def lost(self, want: PendingMeasurement, prefix: str, key: Hashable) -> None:
        """One more trial of ``want`` (``prefix``: how its lines begin) lost; ``key`` names
        the measurement: the same want asked again, or a stage's point."""
        self.times[key] = self.times.get(key, 0) + 1
        self.total += 1
        if self.times[key] >= MAX_LOST_PER_WANT:
            raise StudyFailedError(
                f"the executor lost the trial {prefix} {self.times[key]} times; last: "
                f"{want.label} with {want.params}",
                hint=HINT_LOST,
            )
        if self.total > self.budget:
            raise StudyFailedError(
                f"{self.what}: the executor lost {self.total} trials, more than the "
                f"{self.budget} it measures",
                hint=HINT_LOST,
            )


Tell = Callable[[optuna.Study, optuna.Trial, Evaluated], None]


class RunningTrials:
    """The trials in flight on one executor, keyed by job key."""

    def __init__(
        self,
        executor: Executor,
        config: TunerConfig,
        storage: optuna.storages.RDBStorage,
        paths: StudyPaths,
        specs: dict[str, Any],
        say: Callable[[str], None],
    ) -> None:
        self.executor, self.config, self.storage = executor, config, storage
        self.paths, self.specs, self.say = paths, specs, say
        self.active: dict[str, RunningTrial] = {}

    @property
    def parallel(self) -> bool:
        """Trials may run side by side (or away from this process): not the serial path."""
        return self.executor.name != "local"

    def resolved_of(self, params: dict[str, Any]) -> ResolvedLaunch:
        """The launch of stored ``params`` on this study's server."""
        return resolve_params(params, self.specs, self.config.server)

    def fits(self, launch: ResolvedLaunch) -> bool:
        return self.executor.fits(demand_of(self.config, launch))

    def start(self, want: PendingMeasurement, trial: optuna.Trial) -> RunningTrial:
        """Submit ``trial`` (asked already) to the executor, under a storage heartbeat."""
        launch = want.launch or self.resolved_of(want.params)
        name = f"{want.label}-{trial.number}"
        prefix = f"[{want.label} #{trial.number}]"
        # The client's processes carry the trial's expected token events (the plan's estimate)
        config = client_capacity.for_job(
            self.config,
            launch.devices,
            trial.user_attrs,
            lambda line: self.say(f"{prefix} {line}"),
        )
        job = TrialJob(
            key=f"{trial.study.study_name}#{trial.number}",
            trial_id=name,
            config=config,
            launch=launch,
            folder=self.paths.trial(name).root,
            prefix=prefix,
            demand=demand_of(config, launch),
        )
        beat = Heartbeat(self.storage, trial_id(self.storage, trial.study, trial.number))
        flight = RunningTrial(want, trial, launch.spec, job, beat.__enter__())
        self.active[job.key] = flight
        self.executor.submit(job)
        return flight

    def next(self) -> tuple[RunningTrial, JobResult]:
        """The next trial to finish, with its result; whatever the wait raises stops every
        trial in flight first (:meth:`abandon`)."""
        try:
            result = self.executor.wait()
        except BaseException as exc:
            self.abandon(exc)
            raise
        flight = self.active.pop(result.key)
        flight.heartbeat.__exit__(None, None, None)
        return flight, result

    def abandon(self, exc: BaseException) -> None:
        """Stop the trials in flight and mark each failed: the next run re-asks them."""
        self.executor.cancel_all()
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by an error"
        for flight in list(self.active.values()):
            flight.heartbeat.__exit__(None, None, None)
            flight.trial.set_user_attr(TrialAttr.INTERRUPTED, True)
            flight.trial.study.tell(flight.trial, state=TrialState.FAIL)
            self.say(f"{flight.prefix} {what}: trial marked failed; run the same command to resume")
        self.active.clear()

    def measure(
        self,
        wants: list[PendingMeasurement],
        land: OnFinished,
        tell: Tell,
        stop: Callable[[Evaluated], bool] | None = None,
    ) -> list[Evaluated]:
        """Measure every want, ``executor.slots`` at a time, and tell each as it lands; a lost
        one is asked again. ``stop``: no new trial starts once a landed one meets it."""
        results: dict[int, Evaluated] = {}
        queue = list(enumerate(wants))
        labels = ", ".join(dict.fromkeys(w.label for w in wants))
        lost = LostTrials(labels, len(wants) * MAX_LOST_PER_WANT)
        waiting: dict[str, int] = {}
        stopped = False
        try:
            while queue or waiting:
                while queue and not stopped and len(waiting) < self.executor.slots:
                    index, want = queue.pop(0)
                    waiting[self._ask(want).job.key] = index
                flight, result = self.next()
                index = waiting.pop(flight.job.key)
                evaluated = land(flight, result)
                if evaluated is None:
                    lost.lost(flight.want, flight.prefix, index)
                    queue.insert(0, (index, flight.want))
                    continue
                tell(flight.want.study, flight.trial, evaluated)
                results[index] = evaluated
                stopped = stopped or bool(stop and stop(evaluated))
        except BaseException as exc:
            if self.active:
                self.abandon(exc)
            raise
        return [results[i] for i in sorted(results)]

    def _ask(self, want: PendingMeasurement) -> RunningTrial:
        if want.note:
            self.say(want.note)
        trial = want.study.ask()
        for key, value in want.attrs.items():
            trial.set_user_attr(key, value)
        return self.start(want, trial)


def record_lost(
    trial: optuna.Trial,
    want: PendingMeasurement,
    prefix: str,
    result: JobResult,
    say: Callable[[str], None],
) -> None:
    """A trial the executor lost: failed (Optuna's FAIL: no sampler learns from it, and the
    stage's budget does not count it), with the reason and where it ran."""
    outcome = result.outcome
    attrs = {
        TrialAttr.STAGE: want.label,
        TrialAttr.ROLE: want.role,
        TrialAttr.STATUS: TrialStatus.FAILED,
        TrialAttr.FAILURE_REASON: outcome.reason,
        TrialAttr.FAILURE_MESSAGE: outcome.message[:500],
        TrialAttr.FOLDER: outcome.folder,
        TrialAttr.PARAMS_ALL: {k: _plain(v) for k, v in want.params.items()},
        DEVICES_ATTR: result.devices.to_attr(),
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    trial.study.tell(trial, state=TrialState.FAIL)
    say(f"{prefix} FAILED ({outcome.reason}): {outcome.message}; measured again")


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)
