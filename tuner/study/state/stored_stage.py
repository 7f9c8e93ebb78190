"""A stage as its storage holds it: a view of one stage's Optuna study.

What the stage search, the confirmation and the prescreen read back of a stage (the trials it
launched, whether a point was measured, what is left of a finite space, its decision) is read
here, from the study itself, so a resumed run sees exactly what the interrupted one did.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import ServerConfig
from tuner.schema import Role, StudyAttr, TrialAttr
from tuner.search import space as search_space
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.stages import Incumbent, Stage, jsonable, point_key
from tuner.trial.outcome import NOT_LAUNCHED


@dataclass(frozen=True)
class StoredStage:
    """One stage's study in the storage, read as that stage."""

    study: optuna.Study
    stage: Stage

    @property
    def name(self) -> str:
        return self.stage.name

    # -- its trials ------------------------------------------------------------------------
    def search_trials(self) -> list[FrozenTrial]:
        """The stage's completed search trials (reused measurements included)."""
        done = self.study.get_trials(states=(TrialState.COMPLETE,))
        return [t for t in done if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH]

    def launched(self) -> list[FrozenTrial]:
        """The search trials that started a server (the stage's budget counts these): not a
        reused measurement, nor a candidate refused before its launch (the prescreen)."""
        return [
            t
            for t in self.search_trials()
            if TrialAttr.REUSED_FROM not in t.user_attrs
            and t.user_attrs.get(TrialAttr.FAILURE_REASON) not in NOT_LAUNCHED
        ]

    def measured(self, point: dict[str, Any]) -> FrozenTrial | None:
        """A completed trial of this stage (the incumbent seed included) at exactly ``point``."""
        wanted = point_key(point)
        done = self.study.get_trials(states=(TrialState.COMPLETE,))
        return next((t for t in done if point_key(t.params) == wanted), None)

    def distinct_points(self) -> int:
        """How many different points of the stage's space have a measurement."""
        done = self.study.get_trials(states=(TrialState.COMPLETE,))
        return len({point_key(t.params) for t in done})

    def exhausted(self, max_proposals_per_trial: int) -> str:
        """Why a stage that reuses measured points should stop short of its budget, or "".

        Every point of a finite space is measured, or the sampler only re-proposes measured
        points: reused proposals cost no launch, so the budget counts launches; this caps the
        proposals at ``max_proposals_per_trial`` per trial of the budget.
        """
        size = search_space.finite_size(self.stage.specs)
        if size is not None and self.distinct_points() >= size:
            return f"all {size} points of its space are measured"
        if len(self.search_trials()) >= max_proposals_per_trial * self.stage.trials:
            return "the sampler keeps proposing measured points; done"
        return ""

    # -- a finite space's points -----------------------------------------------------------
    def queue_unmeasured(self, launched: int) -> list[dict[str, Any]]:
        """Queue every point of a finite stage space not measured nor being measured, once what
        is left of the stage's budget covers them all (the points queued; [] otherwise).

        Rather than trust the sampler there: TPE on a handful of points keeps proposing
        measured ones and may never try the last (replayed in benchmarks/: a 1/2/4/8 TP stage
        that never ran the only TP meeting the SLOs). Nothing is queued while the queue holds
        points already (the prescreen's seeds go first)."""
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return []
        left = self.unmeasured(self.stage.trials - launched)
        for point in left:
            self.study.enqueue_trial(point, skip_if_exists=True)
        return left

    def unmeasured(self, limit: int) -> list[dict[str, Any]]:
        """The points of a finite stage space not measured nor being measured, when there are
        at most ``limit`` of them; [] otherwise (or for a space with a continuous range)."""
        specs = self.stage.specs
        size = search_space.finite_size(specs)
        states = (TrialState.COMPLETE, TrialState.RUNNING)
        trials = self.study.get_trials(deepcopy=False, states=states)
        taken = {point_key(t.params) for t in trials if t.params}
        if size is None or size - len(taken) > limit:  # checked before enumerating a large space
            return []
        values = search_space.grid(specs)
        combos = itertools.product(*values.values())
        points = (dict(zip(values, combo, strict=True)) for combo in combos)
        return [p for p in points if point_key(p) not in taken]

    # -- what the search writes ------------------------------------------------------------
    def seed(
        self, incumbent: Incumbent, server: ServerConfig, defaults: Mapping[str, Any] | None
    ) -> bool:
        """Add the incumbent as a known first trial, so the sampler starts from the control.

        Only when every param of the stage has a known value on the incumbent (``defaults``:
        what the server runs for a flag left out, see tuner.study.state.params_as_run) that lies
        in the stage's space (False otherwise): a trial with a partial point leaves Optuna's
        relative samplers (GP, NSGA-II, multivariate TPE) no common search space, and they fall
        back to random sampling for the whole stage (measured in the replays of benchmarks/).
        """
        trials = self.study.get_trials()
        if any(t.user_attrs.get(TrialAttr.ROLE) == Role.INCUMBENT for t in trials):
            return True
        specs = self.stage.specs
        params = search_space.as_run(incumbent.params, specs, server, defaults)
        if params is None:
            return False
        self.study.add_trial(
            optuna.trial.create_trial(
                values=incumbent.values,
                params=params,
                distributions=search_space.distributions(specs),
                user_attrs={
                    TrialAttr.ROLE: Role.INCUMBENT.value,
                    TrialAttr.SOURCE: incumbent.source,
                    TrialAttr.PARAMS_ALL: jsonable(incumbent.params),
                },
                constraints=incumbent.constraints,
            )
        )
        return True

    def tell_reused(self, trial: optuna.Trial, seen: FrozenTrial) -> None:
        """Answer a repeated proposal with a stored measurement instead of a new launch.

        Samplers re-propose points of small discrete spaces; a launch costs minutes and the
        acceptance step re-measures the winner anyway (Optuna's FAQ: avoid evaluating the same
        parameters twice). The stage's budget counts launches, so it explores as many points.
        """
        for key, value in seen.user_attrs.items():
            if key != TrialAttr.SEEDED:  # who proposed the measured trial, not this one
                trial.set_user_attr(key, value)
        trial.set_user_attr(TrialAttr.ROLE, Role.SEARCH.value)
        trial.set_user_attr(TrialAttr.STAGE, self.name)
        trial.set_user_attr(TrialAttr.REUSED_FROM, seen.number)
        trial.set_user_attr(
            TrialAttr.REUSED_FROM_STAGE, seen.user_attrs.get(TrialAttr.STAGE, self.name)
        )
        for key, value in seen.constraints.items():
            trial.set_constraint(key, value)
        self.study.tell(trial, list(seen.values))

    def link_baseline(self, study_name: str, number: int) -> None:
        """Name the baseline trial this stage was searched against, once."""
        if StudyAttr.BASELINE_STUDY not in self.study.user_attrs:
            self.study.set_user_attr(StudyAttr.BASELINE_STUDY, study_name)
            self.study.set_user_attr(StudyAttr.BASELINE_TRIAL, number)

    def decision(self) -> Decision | None:
        """The stage's decision, once it was taken (a resumed run does not search it again)."""
        stored = self.study.user_attrs.get(StudyAttr.DECISION)
        return None if stored is None else Decision.from_dict(stored)

    def keep_decision(self, decision: Decision) -> None:
        self.study.set_user_attr(StudyAttr.DECISION, jsonable(decision.to_dict()))

    def pareto_front(self) -> list[dict[str, Any]]:
        """The stage's Pareto-optimal trials, as the run's result lists them."""
        return [
            {
                "trial": t.number,
                "role": t.user_attrs.get(TrialAttr.ROLE),
                "values": t.values,
                "params": t.params,
            }
            for t in self.study.best_trials
        ]


def _config(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def measured_config(
    stages: Iterable[StoredStage],
    params_all: dict[str, Any],
    canonical: Callable[[dict[str, Any]], dict[str, Any]],
) -> FrozenTrial | None:
    """A completed search trial of any of ``stages`` that ran exactly this configuration.

    ``canonical`` completes explicit params with what is known to be the same (fixed args,
    vLLM's defaults): {max_num_seqs: 16} is {max_num_seqs: 16, max_num_batched_tokens: 512}
    when the fixed args set 512.
    """
    wanted = _config(canonical(params_all))
    for stored in stages:
        for t in stored.search_trials():
            if _config(canonical(t.user_attrs.get(TrialAttr.PARAMS_ALL, {}))) == wanted:
                return t
    return None
