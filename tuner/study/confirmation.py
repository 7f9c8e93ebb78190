"""A stage's acceptance step: re-measure its winner and the incumbent, interleaved, and decide.

The search trial that won a stage had one window, and the incumbent's windows were taken
earlier; both are measured ``study.repeats`` more times in alternation (in the confirmation
study of :mod:`tuner.schema`, one trial per tagged slot, so a resumed run re-uses what it has) and
:func:`tuner.study.acceptance.decide` keeps the winner only beyond the noise. The noise is the
study's own (:class:`tuner.study.noise.NoisePool`): every configuration it measured more than once.
The winner's search window counts unless ``study.count_search_window`` is false: it was picked
as the best of the stage's draws, so luck picked it too and it reads high; the replays found
that counting it proves more real gains than it lets luck through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config import TunerConfig
from tuner.schema import Role, TrialAttr, confirm_label, confirm_study
from tuner.scoring.feasibility import mean_constraints, meets
from tuner.study.acceptance import Comparison, Decision, decide
from tuner.study.evaluation import Evaluated, Evaluator
from tuner.study.noise import NoiseEstimate, NoisePool
from tuner.study.stages import Incumbent, Repeats, Stage, search_trials, stage_winner

NOTHING_BEAT = "no feasible trial beat the incumbent"
# (study, trial, label, params, role) -> the evaluated measurement, told to ``study`` already
MeasureFn = Callable[[optuna.Study, optuna.Trial, str, dict[str, Any], str], Evaluated]


class Confirmation:
    """Decides each stage against the incumbent; holds the study's noise pool."""

    def __init__(
        self,
        config: TunerConfig,
        evaluator: Evaluator,
        open_study: Callable[[str], optuna.Study],
        measure: MeasureFn,
        say: Callable[[str], None],
    ) -> None:
        self.config, self.evaluator = config, evaluator
        self.open_study, self.measure, self.say = open_study, measure, say
        self.noise = NoisePool()

    def learn(self, incumbent_params: dict[str, Any], decision: Decision) -> None:
        """Pool a (stored) decision's repeats: a resumed study knows what the first run knew."""
        self.noise.add(incumbent_params, decision.incumbent_values)
        if decision.candidate_values:
            self.noise.add(decision.candidate_params, decision.candidate_values)

    def pooled(self) -> NoiseEstimate | None:
        return self.noise.estimate() if self.config.study.pools_noise else None

    def decide(self, study: optuna.Study, stage: Stage, incumbent: Incumbent) -> Decision:
        """Re-measure winner and incumbent interleaved; accept only beyond the noise."""
        idx, sign = self.evaluator.select_index, self.evaluator.select_sign
        winner = stage_winner(search_trials(study), idx, sign, incumbent)
        obj, direction = self.evaluator.select_by, self.evaluator.directions[idx]
        min_gain = self.config.study.min_gain
        inc_ok = meets(incumbent.constraints)
        if winner is None or (inc_ok and sign * winner.values[idx] <= sign * incumbent.values[idx]):
            return Decision(stage.name, obj, direction, False, NOTHING_BEAT)
        cand_params = {**incumbent.params, **winner.params}
        inc, cand = self._repeats(stage, incumbent, cand_params, winner)
        self.noise.add(incumbent.params, inc.values)
        self.noise.add(cand_params, cand.values)
        inc_c, cand_c = mean_constraints(inc.constraints), mean_constraints(cand.constraints)
        comparison = Comparison(
            stage.name, obj, direction, inc.values, cand.values, meets(cand_c), min_gain,
            meets(inc_c), self.pooled(),
        )  # fmt: skip
        return replace(
            decide(comparison),
            candidate_trial=winner.number,
            candidate_params=cand_params,
            candidate_objectives=list(winner.values),
            candidate_constraints=cand_c,
            incumbent_constraints=inc_c,
        )

    def _repeats(
        self,
        stage: Stage,
        incumbent: Incumbent,
        cand_params: dict[str, Any],
        winner: optuna.trial.FrozenTrial,
    ) -> tuple[Repeats, Repeats]:
        """The incumbent's measurements, the candidate's search window where it counts
        (``study.count_search_window``), then ``study.repeats`` more of each, interleaved."""
        idx = self.evaluator.select_index
        confirm = self.open_study(confirm_study(self.config.name))
        # Its earlier measurements count as many times as they are (their constraints are only
        # kept as means: repeated so that the new mean weighs every measurement alike).
        samples = incumbent.samples or [incumbent.values[idx]]
        inc = Repeats(list(samples), [dict(incumbent.constraints)] * len(samples))
        cand = Repeats([], [])
        if self.config.study.keeps_search_window:
            cand = Repeats([winner.values[idx]], [dict(winner.constraints)])
        for rnd in range(self.config.study.repeats):
            for role, params, out in (
                (Role.INCUMBENT, incumbent.params, inc),
                (Role.CANDIDATE, cand_params, cand),
            ):
                result = self._run(confirm, stage.name, rnd, role, params)
                out.values.append(result.values[idx])
                out.constraints.append(dict(result.constraints))
        return inc, cand

    def _run(
        self, confirm: optuna.Study, stage: str, rnd: int, role: str, params: dict[str, Any]
    ) -> Evaluated:
        tag = f"{stage}/{rnd}/{role}"
        for t in confirm.get_trials(states=(TrialState.COMPLETE,)):
            if t.user_attrs.get(TrialAttr.CONFIRM_TAG) == tag:  # measured before an interrupt
                return self.evaluator.from_attrs(t)
        self.say(f"stage {stage}: confirm round {rnd + 1}/{self.config.study.repeats}: {role}")
        trial = confirm.ask()
        trial.set_user_attr(TrialAttr.CONFIRM_TAG, tag)
        return self.measure(confirm, trial, confirm_label(stage), params, role)
