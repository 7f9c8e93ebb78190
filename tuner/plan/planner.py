"""`tuner plan`: every point of a study's search space (or a sample), estimated on the target
GPU system before anything is bought or launched: fits or not, TTFT, TPOT, throughput per GPU,
cost per million tokens; a table, plan.csv and plan.png; with a target rate, the replicas.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.config import ParamSpec, TunerConfig
from tuner.errors import ConfigError
from tuner.paths import StudyPaths
from tuner.plan import points as plan_space
from tuner.plan import table as plan_table
from tuner.plan.demand import host_gpus, over_host
from tuner.plan.estimate import Estimator, Fit, PointEstimate
from tuner.plan.sizing import Sizing, check_target, server_price, size
from tuner.plan.system import backend_version, gpu_name, resolve_model_source, resolve_system
from tuner.plan.table import PlannedPoint

PLAN_DIR = "plan"


class Planner:
    """A study's configuration, estimated on its target GPU system (loaded once)."""

    def __init__(self, config: TunerConfig) -> None:
        self.config = config
        self.system = resolve_system(config.plan)
        self.version = backend_version(self.system, config.plan.backend_version)
        self.source = resolve_model_source(config.plan.model or config.server.model)
        self.model = self.source.target
        self.estimator = Estimator(self.system, self.version, self.model)
        self.gpu = gpu_name(self.system)
        self.defaults = plan_space.vllm_defaults(self.estimator.gpu_memory_gib, self.gpu)
        self.host_gpus = host_gpus(config)  # 0: not known here, so never a reason to refuse

    @classmethod
    def available(cls, config: TunerConfig) -> Planner | None:
        """A planner where estimates can be made (AIConfigurator installed, a GPU system named
        or seen, a model it can read), else None: a check that needs one stays silent."""
        if config.server.device != "cuda":
            return None
        try:
            return cls(config)
        except ConfigError:
            return None

    def describe(self) -> str:
        return f"{self.source.shown} on {self.system} (AIConfigurator, vLLM {self.version} data)"

    def estimate(self, params: Mapping[str, Any]) -> PointEstimate:
        """The estimate of the server ``params`` (on top of the fixed args) runs; a point that
        needs more GPUs than the host has does not fit, whatever its memory says."""
        point = plan_space.point_of(self.config, params, self.defaults)
        too_many = over_host(self.config, params, self.host_gpus)
        if too_many is not None:
            return PointEstimate(point, Fit.NO, too_many)
        return self.estimator.estimate(point)

    def planned(self, params: Mapping[str, Any]) -> PlannedPoint:
        e = self.estimate(params)
        price = server_price(self.config.cost, "cuda", self.gpu, e.point.gpus, 0)
        return PlannedPoint(dict(params), e, price.per_hour)

    def space(
        self, specs: Mapping[str, ParamSpec], base: Mapping[str, Any] | None = None
    ) -> tuple[list[PlannedPoint], int, list[str]]:
        """The points of ``specs`` that change an estimate (a sample beyond plan.max_points),
        each on top of ``base`` params; how many such points there are; and the params left
        out as not modelled. A point's ``params`` are its own, without ``base``."""
        kept, ignored = plan_space.modelled(specs)
        cfg = self.config.plan
        grid, total = plan_space.grid(
            kept, cfg.values_per_range, cfg.max_points, self.config.study.seed
        )
        planned = [self.planned({**(base or {}), **p}) for p in grid]
        pairs = zip(grid, planned, strict=True)
        points = [PlannedPoint(p, e.estimate, e.price_per_hour) for p, e in pairs]
        return points, total, ignored

    def sizing(self, points: list[PlannedPoint], target_rps: float) -> tuple[Sizing, PlannedPoint]:
        """Replicas for ``target_rps`` with the point that needs the fewest GPUs for it among
        those whose estimates meet the SLOs (or, if none does, among those that start)."""
        starts = [p for p in points if p.estimate.starts and p.estimate.requests_s > 0]
        meeting = [p for p in starts if p.meets(self.config.slo)] or starts
        if not meeting:
            raise ConfigError("no point of the space would start: nothing to size with")
        best = max(meeting, key=lambda p: p.estimate.requests_s / p.estimate.point.gpus)
        e = best.estimate
        price = server_price(self.config.cost, "cuda", self.gpu, e.point.gpus, 0)
        headroom = self.config.plan.headroom
        return size(target_rps, headroom, e.requests_s, e.point.gpus, price), best


def plan_command(config: TunerConfig, target_rps: float | None, out_dir: Path | None) -> int:
    """Estimate the study's space, print the table, write plan.csv and plan.png."""
    target = config.plan.target_rps if target_rps is None else target_rps
    if target_rps is not None or target:
        check_target(target, config.plan.headroom)
    started = time.monotonic()
    planner = Planner(config)
    specs = plan_space.study_specs(config)
    points, total, ignored = planner.space(specs)
    kept = [p for p in specs if p not in ignored]
    table = plan_table.ranked(plan_table.frame(points, config.slo))
    folder = out_dir or StudyPaths.for_study(config.studies_dir, config.name).root / PLAN_DIR
    plan_table.write_csv(table, folder / "plan.csv")
    plan_table.write_png(table, folder / "plan.png", planner.describe())
    print(_header(planner, config, len(points), total, ignored))
    print(plan_table.text(table, kept))
    if target:
        sizing, best = planner.sizing(points, target)
        print("\n".join(sizing.lines(f"estimated for {best.params or 'the fixed args'}")))
    elapsed = time.monotonic() - started
    print(f"{len(points)} points in {elapsed:.1f} s: {folder / 'plan.csv'}, {folder / 'plan.png'}")
    _say_estimates_only()
    return 0


def _header(
    planner: Planner, config: TunerConfig, shown: int, total: int, ignored: list[str]
) -> str:
    isl, osl = plan_space.mean_lengths(config.workload)
    wl = config.workload
    load = f"{wl.concurrency} users" if wl.mode == "closed" else f"open loop {wl.rate:g} req/s"
    sampled = f" sampled of {total}" if total > shown else ""
    lines = [f"plan: {planner.describe()}"]
    if planner.source.note:
        lines.append(f"model: {planner.source.note}")
    if planner.host_gpus:
        gpus = f"{planner.host_gpus} GPU{'s' * (planner.host_gpus != 1)}"
        lines.append(f"host: {gpus}; a point that needs more cannot start here")
    lines += [
        f"workload: {isl} prompt / {osl} output tokens on average, {load}; "
        f"points: {shown}{sampled}",
    ]
    if ignored:
        lines.append(f"not modelled (no effect on an estimate): {', '.join(ignored)}")
    return "\n".join(lines)


def _say_estimates_only() -> None:
    print(
        "estimates are steady-state means at a full batch (no queueing, no tails): they screen "
        "and order; only a measurement decides",
        file=sys.stderr,
    )
