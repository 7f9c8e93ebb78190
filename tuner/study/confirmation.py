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
from tuner.scoring.feasibility import mean_constraints, meets, violation
from tuner.study.acceptance import (
    Comparison,
    Decision,
    ObjectiveChange,
    decide,
    objective_changes,
    resolution_line,
)
from tuner.study.evaluation import Evaluated, Evaluator
from tuner.study.flights import Want
from tuner.study.noise import NoiseEstimate, NoisePool
from tuner.study.stages import Incumbent, Repeats, Stage, measured_ok, stage_winner
from tuner.study.stored_stage import StoredStage

NOTHING_BEAT = "no feasible trial beat the incumbent"
# Measurements (side by side where the executor has the slots) -> each evaluated, told already
MeasureFn = Callable[[list[Want]], list[Evaluated]]


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
        # every objective's values of each side's windows in the current confirmation
        self._rows: dict[str, list[list[float]]] = {Role.INCUMBENT: [], Role.CANDIDATE: []}

    def learn(self, incumbent_params: dict[str, Any], decision: Decision) -> None:
        """Pool a (stored) decision's repeats: a resumed study knows what the first run knew."""
        self.noise.add(incumbent_params, decision.incumbent_values)
        if decision.candidate_values:
            self.noise.add(decision.candidate_params, decision.candidate_values)

    def learn_baseline(self, baseline: Incumbent, trials: list[optuna.trial.FrozenTrial]) -> str:
        """Pool the baseline's windows; what their spread means for the study, said once
        before the stages start (:func:`tuner.study.acceptance.resolution_line`)."""
        self.noise.add(baseline.params, baseline.samples)
        cfg = self.config.study
        slices = [t.user_attrs.get(TrialAttr.WINDOW_SLICES) or [] for t in trials]
        return resolution_line(
            self.evaluator.select_by,
            baseline.samples,
            cfg.repeats,
            cfg.min_gain,
            cfg.pools_noise,
            cfg.candidate_windows,
            slices,
        )

    def pooled(self) -> NoiseEstimate | None:
        return self.noise.estimate() if self.config.study.pools_noise else None

    def decide(
        self,
        stored: StoredStage,
        incumbent: Incumbent,
        base: dict[str, Any] | None = None,
    ) -> Decision:
        """Re-measure winner and incumbent interleaved; accept only beyond the noise. The
        stage searched around ``base`` (a lead's params; default the incumbent's)."""
        stage, idx, sign = stored.stage, self.evaluator.select_index, self.evaluator.select_sign
        trials = stored.search_trials()
        winner = stage_winner(trials, idx, sign, incumbent)
        obj, direction = self.evaluator.select_by, self.evaluator.directions[idx]
        inc_ok = meets(incumbent.constraints)
        if winner is None or (inc_ok and sign * winner.values[idx] <= sign * incumbent.values[idx]):
            return Decision(stage.name, obj, direction, False, NOTHING_BEAT)
        decision, inc = self._confirm(stage, incumbent, base, winner)
        second = self._runner_up(stored, trials, incumbent, winner, decision, base)
        if second is None:
            return decision
        self.say(
            f"stage {stage.name}: trial {winner.number} missed the SLOs on its repeats; "
            f"confirming trial {second.number} {second.params}, whose window met them"
        )
        other, _ = self._confirm(stage, incumbent, base, second, inc)
        if not other.accepted:
            return decision
        return replace(
            other,
            passed_over_trial=winner.number,
            passed_over_constraints=decision.candidate_constraints,
        )

    def _runner_up(
        self,
        stored: StoredStage,
        trials: list[optuna.trial.FrozenTrial],
        incumbent: Incumbent,
        winner: optuna.trial.FrozenTrial,
        decision: Decision,
        base: dict[str, Any] | None = None,
    ) -> optuna.trial.FrozenTrial | None:
        """The stage's next best trial whose window met the constraints, when the winner's
        repeats did not and what is left of the stage's budget pays for its repeats: a winner
        whose window read just under an SLO must not shadow a trial that meets it with room
        (replayed in benchmarks/: TP 4 read 0.1 % under the TPOT SLO once, TP 8 met it by 20 %).

        Around a lead (``base``) while the incumbent misses the SLOs, which only a lead the
        estimator named does, its repeats are paid past the budget: else the stage hands over
        the nearer miss of two, the winner, where a point that met the SLOs was measured."""
        if meets(decision.candidate_constraints):
            return None
        lead = base is not None and base != incumbent.params
        paid = lead and not meets(incumbent.constraints)
        left = stored.stage.trials - len(stored.launched())
        if not paid and left < self.config.study.repeats:
            return None
        idx, sign = self.evaluator.select_index, self.evaluator.select_sign
        others = [
            t
            for t in trials
            if t.params != winner.params and measured_ok(t) and meets(t.constraints)
        ]
        if meets(incumbent.constraints):
            others = [t for t in others if sign * t.values[idx] > sign * incumbent.values[idx]]
        return max(others, key=lambda t: sign * t.values[idx]) if others else None

    def _confirm(
        self,
        stage: Stage,
        incumbent: Incumbent,
        base: dict[str, Any] | None,
        winner: optuna.trial.FrozenTrial,
        against: Repeats | None = None,
    ) -> tuple[Decision, Repeats]:
        """``winner`` re-measured and compared with the incumbent: interleaved with the
        incumbent's repeats, or against those of an earlier confirmation (``against``)."""
        idx = self.evaluator.select_index
        obj, min_gain = self.evaluator.select_by, self.config.study.min_gain
        cand_params = {**(incumbent.params if base is None else base), **winner.params}
        inc, cand = self._repeats(stage, incumbent, cand_params, winner, against)
        if against is None:
            self.noise.add(incumbent.params, inc.values)
        self.noise.add(cand_params, cand.values)
        judged = cand.constraints
        fresh = cand.constraints[1:] if self.config.study.keeps_search_window else []
        if base is not None and fresh:
            # Around a lead (a point known to miss the SLOs), the window picked is the one that
            # read under them: judged with it, a point just over an SLO passes more often than
            # its repeats say. Its fresh repeats alone decide.
            judged = fresh
        inc_c, cand_c = mean_constraints(inc.constraints), mean_constraints(judged)
        comparison = Comparison(
            stage.name,
            obj,
            self.evaluator.directions[idx],
            inc.values,
            cand.values,
            meets(cand_c),
            min_gain,
            meets(inc_c),
            self.pooled(),
            violation(inc_c),
            violation(cand_c),
        )
        decision = replace(
            decide(comparison),
            candidate_trial=winner.number,
            candidate_params=cand_params,
            candidate_objectives=list(winner.values),
            candidate_constraints=cand_c,
            incumbent_constraints=inc_c,
            candidate_constraint_windows=[dict(c) for c in judged],
            incumbent_constraint_windows=[dict(c) for c in inc.constraints],
            others=self._others(obj, min_gain),
        )
        return decision, inc

    def _others(self, select_by: str, min_gain: float) -> list[ObjectiveChange]:
        """The objectives beside ``select_by`` on this confirmation's windows."""
        return objective_changes(
            self.evaluator.names,
            self.evaluator.directions,
            self._rows[Role.INCUMBENT],
            self._rows[Role.CANDIDATE],
            select_by,
            min_gain,
            self.config.check.target,
        )

    def _repeats(
        self,
        stage: Stage,
        incumbent: Incumbent,
        cand_params: dict[str, Any],
        winner: optuna.trial.FrozenTrial,
        against: Repeats | None = None,
    ) -> tuple[Repeats, Repeats]:
        """The incumbent's measurements, the candidate's search window where it counts
        (``study.count_search_window``), then ``study.repeats`` more of each, interleaved;
        with ``against``, those incumbent repeats and only the candidate's."""
        idx = self.evaluator.select_index
        confirm = self.open_study(confirm_study(self.config.name))
        # Its earlier measurements count as many times as they are (their constraints are only
        # kept as means: repeated so that the new mean weighs every measurement alike).
        samples = incumbent.samples or [incumbent.values[idx]]
        inc = against or Repeats(list(samples), [dict(incumbent.constraints)] * len(samples))
        cand = Repeats([], [])
        if against is None:  # against earlier repeats, the incumbent's rows are theirs
            self._rows[Role.INCUMBENT] = []
        self._rows[Role.CANDIDATE] = []
        if self.config.study.keeps_search_window:
            cand = Repeats([winner.values[idx]], [dict(winner.constraints)])
            self._rows[Role.CANDIDATE].append(list(winner.values))
        tag = stage.name if against is None else f"{stage.name}/trial {winner.number}"
        for rnd in range(self.config.study.repeats):
            sides = [(Role.CANDIDATE, cand_params, cand)]
            if against is None:
                sides.insert(0, (Role.INCUMBENT, incumbent.params, inc))
            results = self._round(confirm, stage.name, tag, rnd, [(r, p) for r, p, _ in sides])
            for (role, _, out), result in zip(sides, results, strict=True):
                self._rows[role].append(list(result.values))
                out.values.append(result.values[idx])
                out.constraints.append(dict(result.constraints))
        return inc, cand

    def _round(
        self,
        confirm: optuna.Study,
        stage: str,
        tag_of: str,
        rnd: int,
        sides: list[tuple[str, dict[str, Any]]],
    ) -> list[Evaluated]:
        """Both sides of one round, in order: a side measured before an interrupt is read back;
        the others are measured, side by side when the executor has two slots (on disjoint
        devices, at the same time: the same conditions for both)."""
        stored = {
            t.user_attrs.get(TrialAttr.CONFIRM_TAG): t
            for t in confirm.get_trials(states=(TrialState.COMPLETE,))
        }
        results: list[Evaluated | None] = []
        wants = []
        for role, params in sides:
            tag = f"{tag_of}/{rnd}/{role}"
            if tag in stored:
                results.append(self.evaluator.from_attrs(stored[tag]))
                continue
            note = f"stage {stage}: confirm round {rnd + 1}/{self.config.study.repeats}: {role}"
            attrs = {TrialAttr.CONFIRM_TAG: tag}
            wants.append(Want(confirm, confirm_label(stage), params, role, attrs, note))
            results.append(None)
        measured = iter(self.measure(wants) if wants else [])
        return [r if r is not None else next(measured) for r in results]
