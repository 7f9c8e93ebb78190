"""A stage of a study: one parameter group searched against the incumbent.

The plan (which groups, in which order, or all of them at once for the joint strategy), the
incumbent that enters a stage, and what a finished study returns.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from tuner.config import ParamSpec, ServerConfig, TunerConfig
from tuner.schema import REFINE, Role, TrialAttr, TrialStatus
from tuner.scoring.feasibility import Edge, edges, mean_constraints, meets, violation
from tuner.search import space as search_space
from tuner.study.acceptance import Decision
from tuner.trial.outcome import NOT_LAUNCHED


@dataclass
class Stage:
    name: str
    specs: dict[str, ParamSpec]
    trials: int  # search trials of this stage (the incumbent seed and confirmations aside)


@dataclass
class Incumbent:
    """The best configuration so far: explicit params on top of the fixed args."""

    params: dict[str, Any]
    values: list[float]  # every objective; the selection objective at its mean over samples
    constraints: dict[str, float]  # each at its mean over the measurements
    source: str
    samples: list[float] = field(default_factory=list)  # its selection-objective measurements
    # its constraints per measurement, the windows `constraints` is the mean of (SLO-edge check)
    constraint_windows: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Repeats:
    """One side of a confirmation: its selection-objective values and constraint sets, one per
    measurement (the search or incumbent measurement first, then the re-measurements)."""

    values: list[float]
    constraints: list[dict[str, float]]


@dataclass
class StudyResult:
    baseline: Incumbent
    final: Incumbent
    decisions: list[Decision] = field(default_factory=list)
    pareto: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def final_edges(self) -> list[Edge]:
        """The SLOs the hand-over meets by less than one window's spread (none when it misses
        one: that is a miss, not an edge), the spread pooled over every configuration the study
        measured more than once."""
        final = self.final.constraint_windows
        if not meets(self.final.constraints):
            return []
        groups = [self.baseline.constraint_windows]
        for d in self.decisions:
            groups += [d.candidate_constraint_windows, d.incumbent_constraint_windows]
        return edges(final, [g for g in groups if g and g != final])


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


def measured_ok(trial: optuna.trial.FrozenTrial) -> bool:
    """The trial's server ran and its load was measured (not a failed start or load)."""
    return trial.user_attrs.get(TrialAttr.STATUS) == TrialStatus.OK


def ok_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if measured_ok(t)]


def baseline_incumbent(trials: Sequence[optuna.trial.FrozenTrial], select_index: int) -> Incumbent:
    """The control as the first incumbent: the means of the baseline's measurements."""
    values = [float(v) for v in np.mean([t.values for t in trials], axis=0)]
    constraints = mean_constraints([t.constraints for t in trials])
    samples = [t.values[select_index] for t in trials]
    windows = [dict(t.constraints) for t in trials]
    return Incumbent({}, values, constraints, Role.BASELINE, samples, windows)


def spec_text(spec: ParamSpec) -> str:
    choices = search_space.choices_of(spec)
    if choices is not None:
        return str(choices)
    return f"[{spec.low}, {spec.high}]{' log' if spec.log else ''}"


def search_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The stage's completed search trials (reused measurements included)."""
    done = study.get_trials(states=(TrialState.COMPLETE,))
    return [t for t in done if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH]


def stage_winner(
    trials: Sequence[optuna.trial.FrozenTrial],
    select_index: int,
    select_sign: float,
    incumbent: Incumbent | None = None,
) -> optuna.trial.FrozenTrial | None:
    """The best feasible of a stage's ``trials`` by the selection objective; with an
    ``incumbent`` that violates a constraint and no feasible trial, the nearest miss closer than
    the incumbent (a single window's P99 cannot rule it out: it goes to the confirmation, and is
    accepted only if it meets every constraint on the mean of its repeats)."""
    measured = [t for t in trials if measured_ok(t)]
    feasible = [t for t in measured if meets(t.constraints)]
    if feasible:
        return max(feasible, key=lambda t: select_sign * t.values[select_index])
    if incumbent is None or meets(incumbent.constraints) or not measured:
        return None
    near = min(measured, key=lambda t: violation(t.constraints))
    return near if violation(near.constraints) < violation(incumbent.constraints) else None


def launched_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The search trials that started a server (a stage's budget counts these): not a reused
    measurement, nor a candidate refused before its launch (tuner.study.prescreen)."""
    return [
        t
        for t in search_trials(study)
        if TrialAttr.REUSED_FROM not in t.user_attrs
        and t.user_attrs.get(TrialAttr.FAILURE_REASON) not in NOT_LAUNCHED
    ]


def point_key(params: dict[str, Any]) -> str:
    """A point's identity among a stage's trials (its params, in any order)."""
    return repr(sorted(params.items()))


def measured_point(study: optuna.Study, params: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
    """A completed trial of this stage (the incumbent seed included) at exactly ``params``."""
    wanted = point_key(params)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    return next((t for t in done if point_key(t.params) == wanted), None)


def distinct_points(study: optuna.Study) -> int:
    """How many different points of the stage's space have a measurement."""
    return len({point_key(t.params) for t in study.get_trials(states=(TrialState.COMPLETE,))})


def queue_unmeasured(study: optuna.Study, stage: Stage, launched: int) -> list[dict[str, Any]]:
    """Queue every point of a finite stage space not measured nor being measured, once what is
    left of the stage's budget covers them all (the points queued; [] otherwise).

    Rather than trust the sampler there: TPE on a handful of points keeps proposing measured
    ones and may never try the last (replayed in benchmarks/: a 1/2/4/8 TP stage that never ran
    the only TP meeting the SLOs). Nothing is queued while the queue holds points already (the
    prescreen's seeds go first)."""
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return []
    left = unmeasured_points(study, stage, stage.trials - launched)
    for point in left:
        study.enqueue_trial(point, skip_if_exists=True)
    return left


def unmeasured_points(study: optuna.Study, stage: Stage, limit: int) -> list[dict[str, Any]]:
    """The points of a finite stage space not measured nor being measured, when there are at
    most ``limit`` of them; [] otherwise (or for a space with a continuous range)."""
    size = search_space.finite_size(stage.specs)
    states = (TrialState.COMPLETE, TrialState.RUNNING)
    trials = study.get_trials(deepcopy=False, states=states)
    taken = {point_key(t.params) for t in trials if t.params}
    if size is None or size - len(taken) > limit:  # checked before enumerating a large space
        return []
    values = search_space.grid(stage.specs)
    combos = itertools.product(*values.values())
    points = (dict(zip(values, combo, strict=True)) for combo in combos)
    return [p for p in points if point_key(p) not in taken]


def _config(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def measured_config(
    studies: Iterable[optuna.Study],
    params_all: dict[str, Any],
    canonical: Callable[[dict[str, Any]], dict[str, Any]],
) -> optuna.trial.FrozenTrial | None:
    """A completed search trial of any of ``studies`` that ran exactly this configuration.

    ``canonical`` completes explicit params with what is known to be the same (fixed args,
    vLLM's defaults): {max_num_seqs: 16} is {max_num_seqs: 16, max_num_batched_tokens: 512}
    when the fixed args set 512.
    """
    wanted = _config(canonical(params_all))
    for study in studies:
        for t in search_trials(study):
            if _config(canonical(t.user_attrs.get(TrialAttr.PARAMS_ALL, {}))) == wanted:
                return t
    return None


def jsonable(value: Any) -> Any:
    """``value`` as JSON gives it back (what Optuna stores in attrs)."""
    return json.loads(json.dumps(value, default=str))


def seed_incumbent(
    study: optuna.Study,
    stage: Stage,
    incumbent: Incumbent,
    server: ServerConfig,
    defaults: Mapping[str, Any] | None = None,
) -> bool:
    """Add the incumbent as a known first trial, so the sampler starts from the control.

    Only when every param of the stage has a known value on the incumbent (``defaults``: what
    the server runs for a flag left out, see tuner.study.canonical) that lies in the
    stage's space (False otherwise): a trial with a partial point leaves Optuna's relative
    samplers (GP, NSGA-II, multivariate TPE) no common search space, and they fall back to
    random sampling for the whole stage (measured in the replays of benchmarks/).
    """
    if any(t.user_attrs.get(TrialAttr.ROLE) == Role.INCUMBENT for t in study.get_trials()):
        return True
    params = search_space.resolve(incumbent.params, stage.specs, server, defaults)
    if params is None:
        return False
    study.add_trial(
        optuna.trial.create_trial(
            values=incumbent.values,
            params=params,
            distributions=search_space.distributions(stage.specs),
            user_attrs={
                TrialAttr.ROLE: Role.INCUMBENT.value,
                TrialAttr.SOURCE: incumbent.source,
                TrialAttr.PARAMS_ALL: jsonable(incumbent.params),
            },
            constraints=incumbent.constraints,
        )
    )
    return True


def tell_reused(
    study: optuna.Study, trial: optuna.Trial, seen: optuna.trial.FrozenTrial, stage: str
) -> None:
    """Answer a repeated proposal with a stored measurement instead of a new launch.

    Samplers re-propose points of small discrete spaces; a launch costs minutes and the
    acceptance step re-measures the winner anyway (Optuna's FAQ: avoid evaluating the same
    parameters twice). The stage's budget counts launches, so it explores as many points.
    """
    for key, value in seen.user_attrs.items():
        if key != TrialAttr.SEEDED:  # who proposed the measured trial, not this one
            trial.set_user_attr(key, value)
    trial.set_user_attr(TrialAttr.ROLE, Role.SEARCH.value)
    trial.set_user_attr(TrialAttr.STAGE, stage)
    trial.set_user_attr(TrialAttr.REUSED_FROM, seen.number)
    trial.set_user_attr(TrialAttr.REUSED_FROM_STAGE, seen.user_attrs.get(TrialAttr.STAGE, stage))
    for key, value in seen.constraints.items():
        trial.set_constraint(key, value)
    study.tell(trial, list(seen.values))


def after_decision(
    incumbent: Incumbent, decision: Decision, select_index: int, stage: str
) -> Incumbent:
    """The incumbent after a stage's decision: the candidate if accepted, else the incumbent
    with what its re-measurements taught (the selection objective and the constraints at their
    means over its repeats), so that later stages compare against the better estimate."""
    if not decision.accepted:
        if not decision.incumbent_constraints:
            return incumbent
        values = list(incumbent.values)
        values[select_index] = decision.incumbent_mean
        constraints = dict(decision.incumbent_constraints)
        samples = list(decision.incumbent_values)
        windows = list(decision.incumbent_constraint_windows)
        return Incumbent(incumbent.params, values, constraints, incumbent.source, samples, windows)
    # The winner's own objectives, with the selection objective at its confirmed mean.
    values = list(decision.candidate_objectives or incumbent.values)
    values[select_index] = decision.candidate_mean
    return Incumbent(
        dict(decision.candidate_params),
        values,
        dict(decision.candidate_constraints),
        f"{stage} trial {decision.candidate_trial}",
        list(decision.candidate_values),
        list(decision.candidate_constraint_windows),
    )


def pareto_front(study: optuna.Study) -> list[dict[str, Any]]:
    """The stage's Pareto-optimal trials, as the run's result lists them."""
    return [
        {
            "trial": t.number,
            "role": t.user_attrs.get(TrialAttr.ROLE),
            "values": t.values,
            "params": t.params,
        }
        for t in study.best_trials
    ]


def exhausted(study: optuna.Study, stage: Stage, max_proposals_per_trial: int) -> str:
    """Why a stage that reuses measured points should stop short of its budget, or "".

    Every point of a finite space is measured, or the sampler only re-proposes measured points:
    reused proposals cost no launch, so the budget counts launches; this caps the proposals at
    ``max_proposals_per_trial`` per trial of the budget.
    """
    size = search_space.finite_size(stage.specs)
    if size is not None and distinct_points(study) >= size:
        return f"all {size} points of its space are measured"
    if len(search_trials(study)) >= max_proposals_per_trial * stage.trials:
        return "the sampler keeps proposing measured points; done"
    return ""
