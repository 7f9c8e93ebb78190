"""The stage order a staged study runs, chosen from the plan where estimates exist.

A staged study fixes each group at its winner before it searches the next, so the order decides
which pairs it can ever see: precision first finds FP8 at the baseline's TP and then the TP that
FP8 serves best; parallelism first may keep a TP that only the other precision made right. No
order won on every landscape the replays searched (benchmarks/README.md), and which one wins
depends on where the user's SLOs cut the landscape.

So, where the plan can estimate the space (a GPU system named or seen, a model AIConfigurator
reads), the study plays its own staged search on the estimates before the first launch: each
stage moves the incumbent to its group's best estimated point that meets the SLOs under the
study's load (:mod:`tuner.plan.loaded`), when that beats the incumbent by more than
``study.min_gain``, or to the nearest miss while the incumbent misses too, as the acceptance
rule does with measurements. Every order of the groups is played, each also with one group
searched again at the end. The study runs the order whose last incumbent is best; the preset's
order wherever no other beats it by more than ``study.min_gain``, and among equals the fewest
stages. A play is noiseless and finds each group's best point, which a stage of a few noisy
trials may not: the estimates choose the order, and only measurements choose the configuration.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.config import ParamSpec, TunerConfig
from tuner.plan import points as plan_space
from tuner.plan.loaded import Loaded, loaded
from tuner.plan.planner import Planner
from tuner.plan.table import PlannedPoint
from tuner.study.decision.stages import point_key
from tuner.study.loop.prescreen import LOOKAHEAD_TOLERANCE, rank_for

# How far over an SLO an estimate may read and still count as meeting it in a play. The best
# point of a landscape sits on an SLO's edge, and the estimator's TPOT is often a tenth off
# there (benchmarks.plan_fidelity): judged strictly, a play steers away from the very region
# the study must search; measurements, not the play, decide what is handed over.
WITHIN = LOOKAHEAD_TOLERANCE


@dataclass(frozen=True)
class Judged:
    """One point as a play sees it: its rank by the selection objective (lower is better) and
    how far it misses the SLOs under the study's load (0: meets them)."""

    params: dict[str, Any]
    rank: float
    overshoot: float
    planned: PlannedPoint

    @property
    def meets(self) -> bool:
        return self.overshoot == 0

    def beats(self, other: Judged | None, min_gain: float) -> bool:
        """Whether a stage would move from ``other`` to this point: feasible against a miss,
        a smaller miss against a bigger one, or a gain beyond ``min_gain`` between two that
        meet the SLOs."""
        if other is None:
            return True
        if self.meets != other.meets:
            return self.meets
        if not self.meets:
            return self.overshoot < other.overshoot
        return (other.rank - self.rank) / max(abs(other.rank), 1e-12) > min_gain


Judge = Callable[[dict[str, Any]], Judged | None]


@dataclass(frozen=True)
class Played:
    """Where one stage order ends: its last incumbent (None: nothing estimated starts)."""

    order: tuple[str, ...]
    final: Judged | None


@dataclass(frozen=True)
class OrderChoice:
    """The order a study runs and why, with the preset's play beside it."""

    chosen: Played
    preset: Played
    played: int  # how many orders were played

    @property
    def order(self) -> tuple[str, ...]:
        return self.chosen.order

    def line(self) -> str:
        shown = ", ".join(self.order)
        if self.chosen.order == self.preset.order:
            return (
                f"stage order: {shown} (the preset's; no other of {self.played} orders played on "
                f"the plan's estimates ends better: {_end(self.preset.final)})"
            )
        return (
            f"stage order: {shown}, chosen from the plan: played on its estimates it ends at "
            f"{_end(self.chosen.final)}; the preset's order ({', '.join(self.preset.order)}) "
            f"ends at {_end(self.preset.final)}"
        )


def _end(final: Judged | None) -> str:
    if final is None:
        return "no point the estimator says starts"
    e = final.planned.estimate
    where = f"within {WITHIN:.0%} of the SLOs" if final.meets else "missing an SLO"
    params = final.params or "the fixed args"
    return f"{params}, {e.tokens_s_gpu:.0f} output tok/s per GPU {where}"


def judge_with(planner: Planner, select_by: str) -> Judge:
    """A memoised judge of points under the study's load (a play revisits most points)."""
    rank = rank_for(select_by)
    slo = planner.config.slo
    seen: dict[str, Judged | None] = {}

    def judge(params: dict[str, Any]) -> Judged | None:
        key = point_key(params)
        if key not in seen:
            found: Loaded | None = loaded(planner, params)
            seen[key] = (
                None
                if found is None
                else Judged(
                    dict(params), rank(found.planned), found.overshoot(slo, WITHIN), found.planned
                )
            )
        return seen[key]

    return judge


def play(
    order: Sequence[str],
    grids: Mapping[str, list[dict[str, Any]]],
    judge: Judge,
    min_gain: float,
) -> Played:
    """The staged search in ``order`` on the estimates: each stage takes its group's best point
    around the incumbent when it beats the incumbent (:meth:`Judged.beats`)."""
    incumbent = judge({})
    params: dict[str, Any] = {}
    for group in order:
        best: Judged | None = None
        for point in grids.get(group, []):
            found = judge({**params, **point})
            if found is not None and (best is None or found.beats(best, 0.0)):
                best = found
        if best is not None and best.beats(incumbent, min_gain):
            incumbent, params = best, dict(best.params)
    return Played(tuple(order), incumbent)


def candidate_orders(preset: Sequence[str], modelled: set[str]) -> list[tuple[str, ...]]:
    """The preset, then every order of its distinct groups (a group the estimator does not
    model keeps its place), each also with one modelled group searched again at the end."""
    distinct = list(dict.fromkeys(preset))
    slots = [i for i, g in enumerate(distinct) if g in modelled]
    out = [tuple(preset)]
    for perm in itertools.permutations([distinct[i] for i in slots]):
        order = list(distinct)
        for i, group in zip(slots, perm, strict=True):
            order[i] = group
        out.append(tuple(order))
        out += [(*order, g) for g in perm if g != order[-1]]
    return list(dict.fromkeys(out))


def choose_order(planner: Planner, config: TunerConfig, select_by: str) -> OrderChoice | None:
    """The stage order to run (see the module's docstring); None where there is nothing to
    choose: a joint study, or fewer than two groups the estimator models."""
    study = config.study
    preset = [s for s in study.stages if s in config.search_space]
    grids = {g: _grid(config, config.search_space[g]) for g in dict.fromkeys(preset)}
    modelled = {g for g, grid in grids.items() if grid}
    if study.strategy != "staged" or len(modelled) < 2:
        return None
    judge = judge_with(planner, select_by)
    plays = [play(o, grids, judge, study.min_gain) for o in candidate_orders(preset, modelled)]
    return OrderChoice(_pick(plays, study.min_gain), plays[0], len(plays))


def _pick(plays: Sequence[Played], min_gain: float) -> Played:
    """The preset (``plays[0]``) unless a play ends better by more than ``min_gain``; else,
    of the plays that end as well as the best, the one of fewest stages."""
    ended = [p for p in plays if p.final is not None]
    if not ended:
        return plays[0]
    best = ended[0]
    for p in ended[1:]:
        if p.final is not None and best.final is not None and p.final.beats(best.final, 0.0):
            best = p
    assert best.final is not None
    top = best.final
    if plays[0].final is not None and not top.beats(plays[0].final, min_gain):
        return plays[0]
    near = [p for p in ended if p.final is not None and not top.beats(p.final, min_gain)]
    return min(near, key=lambda p: len(p.order))


def _grid(config: TunerConfig, specs: Mapping[str, ParamSpec]) -> list[dict[str, Any]]:
    """The points of a group the estimator tells apart ([] when it models none of them)."""
    kept = plan_space.modelled(specs)[0]
    if not kept:
        return []
    cfg = config.plan
    return plan_space.grid(kept, cfg.values_per_range, cfg.max_points, config.study.seed)[0]
