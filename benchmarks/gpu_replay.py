"""Search efficiency on GPU landscapes: tuner's StudyRunner against random search and the grid.

A landscape is a silicon table (benchmarks.silicon: AIConfigurator's shipped vLLM measurements)
or an estimated one (benchmarks.estimated: AIConfigurator's estimates through the queueing
model of tuner.plan.queueing); every launch sees its configuration's truth through
multiplicative noise at each ``--cv``. The objective is output tok/s per GPU
(objectives/fleet.py) under P99 TTFT and P99 TPOT SLOs, by default each the landscape's median
over the configurations that start (vLLM's defaults then miss one of them, see the summary).

Arms, side by side on the same seeds: vLLM's defaults alone; the grid in vLLM auto_tune's nested
order; random search (``random``: the grid in a random order, the best observed launch handed
over, unconfirmed); tuner staged in the default stage order (conf/study/llama70b_8xh200.yaml's)
and in the other orders of ``--orders``; tuner joint (``joint_tpe_<n>``); and confirmed random
search (``joint_random_<n>``: random samples over every group at once, at joint TPE's budget,
under the same confirmation and acceptance rule). Those arms are a real
:class:`tuner.StudyRunner` (3 baseline launches, 2 interleaved confirmation repeats, the
acceptance rule) whose trial function looks the launch up (tuner.testing.lookup). Scored as
benchmarks.scoring does, per GPU (benchmarks.gpu_scoring).

    .venv/bin/python -m benchmarks.gpu_replay --landscape llama8b_h100
    .venv/bin/python -m benchmarks.gpu_replay --landscape llama70b_h200_1k1k --staged-trials 4
    .venv/bin/python -m benchmarks.gpu_replay --landscape llama8b_h100 --slo-levels 25,50,75

writes ``summary.md``, ``landscape.md`` and ``replay.json`` per noise level to
``benchmarks/results/search_efficiency/gpu/<landscape>/cv_<cv>/``; with ``--slo-levels``, per
level and noise level to ``.../<landscape>/slo_p<level>/cv_<cv>/`` (the SLOs each at that
percentile, benchmarks.gpu_scoring.percentile_slo), which benchmarks.gpu_replay_table gathers.
``replay.json`` also holds each arm's wall seconds per seed (``seconds_per_seed``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import estimated, silicon
from benchmarks.gpu_scoring import (
    GpuReference,
    best_observed,
    edge_flags,
    handed_worse,
    median_slo,
    percentile_slo,
    reference,
    summarize_run,
)
from benchmarks.layout import results
from benchmarks.scoring import aggregate, markdown
from tuner import LengthDist, Planner, RequestClass, TunerConfig, choose_order
from tuner.testing.gpu_landscape import GROUPS, GpuLandscape, GpuSlo, gpu_config, groups_of
from tuner.testing.lookup import StudyStrategy, categorical_space, run_study
from tuner.testing.run_trace import Launch, RunTrace


def load(name: str) -> GpuLandscape:
    if name in estimated.SYSTEMS:
        return estimated.landscape(estimated.SYSTEMS[name])
    if name in silicon.TABLES:
        return silicon.landscape(silicon.TABLES[name])
    raise SystemExit(
        f"unknown landscape {name!r}: {sorted(estimated.SYSTEMS) + sorted(silicon.TABLES)}"
    )


# ---- the arms that need no sampler -----------------------------------------------------------
def walk(name: str, land: GpuLandscape, keys: Sequence[Any], seed: int, slo: GpuSlo) -> RunTrace:
    rng = np.random.default_rng(seed)
    trace = RunTrace(name, seed, [Launch(name, k, land.draw(k, rng)) for k in keys])
    trace.selected = best_observed(trace, land, slo)
    return trace


def plain_arms(land: GpuLandscape, seed: int, slo: GpuSlo) -> list[RunTrace]:
    grid = land.grid_keys()
    shuffled = [grid[i] for i in np.random.default_rng(10_000 + seed).permutation(len(grid))]
    return [
        walk("defaults", land, [land.key({})], seed, slo),
        walk("grid", land, grid, seed, slo),
        walk("random", land, shuffled, seed, slo),
    ]


def strategies(
    land: GpuLandscape,
    orders: Sequence[Sequence[str]],
    staged: int,
    joint: int,
    refine: int = 0,
    prescreen: bool = False,
) -> list[tuple[StudyStrategy, dict[str, list[str]]]]:
    """(strategy, its stage groups): staged TPE in each order (with ``prescreen``, each also
    with the plan's pre-screen and seeding), the first order again with a last joint stage of
    ``refine`` trials (study.refine_trials), joint TPE over every param."""
    out = []
    for order in orders:
        groups = groups_of(land, order)
        passes = tuple(g for g in order if g in groups)  # a group named twice is searched twice
        name = f"staged_tpe_{staged}_" + "-".join(g[:4] for g in passes)
        out.append((StudyStrategy(name, "staged", "tpe", staged, stages=passes), groups))
        if prescreen:
            screened = StudyStrategy(
                f"{name}_prescreen", "staged", "tpe", staged, prescreen=True, stages=passes
            )
            out.append((screened, groups))
    if refine:
        first, groups = out[0]
        refined = StudyStrategy(
            f"{first.name}_refine_{refine}", "staged", "tpe", staged, refine_trials=refine
        )
        out.insert(1, (refined, groups))
    everything = {"joint": [p for ps in groups_of(land, list(GROUPS)).values() for p in ps]}
    out.append((StudyStrategy(f"joint_tpe_{joint}", "joint", "tpe", joint), everything))
    out.append((confirmed_random(joint), everything))
    return out


def confirmed_random(trials: int) -> StudyStrategy:
    """Random search as a fair peer of the tuner arms: random samples over every group at once
    through the same StudyRunner (baseline, confirmation repeats, acceptance rule) at joint
    TPE's budget, so a gap to TPE is the sampler's, not the confirmation's. As benchmarks.replay
    builds it: no startup trials (every random trial is a startup trial)."""
    return StudyStrategy(f"joint_random_{trials}", "joint", "random", trials, 2, 0)


Arm = tuple[StudyStrategy, Mapping[str, list[str]]]


def estimated_on(config: TunerConfig, table: silicon.SiliconTable, land: GpuLandscape) -> None:
    """What the plan needs to estimate a silicon table's points (study.prescreen): its GPU
    system and vLLM data, the architecture of the measured checkpoint and the precision the
    plan estimates it in (``SiliconTable.quantization``), and its lengths; every user count of
    the table is a closed-loop user (a point's batch is then its max_num_seqs, as it was
    measured)."""
    config.plan.system, config.plan.backend_version = table.system, estimated.VERSION
    config.plan.model = table.estimator_model
    if table.quantization:
        config.server.args["quantization"] = table.quantization
    config.workload.classes = [
        RequestClass(
            prompt_tokens=LengthDist(mean=table.isl), output_tokens=LengthDist(mean=table.osl)
        )
    ]
    config.workload.concurrency = max(land.values()["max_num_seqs"])


def planned_on(config: TunerConfig, name: str, land: GpuLandscape) -> bool:
    """What the plan needs to estimate the landscape ``name`` (its GPU system, model, lengths
    and users); False where it cannot (a silicon table without an estimator model)."""
    if name in estimated.SYSTEMS:
        system = estimated.SYSTEMS[name]
        config.plan.system, config.plan.backend_version = system.gpu, estimated.VERSION
        config.plan.model = system.model
        load = system.load
        config.workload.classes = [
            RequestClass(
                prompt_tokens=LengthDist(mean=load.isl), output_tokens=LengthDist(mean=load.osl)
            )
        ]
        config.workload.concurrency = load.users
        return True
    table = silicon.TABLES.get(name)
    if table is None or not table.estimator_model:
        return False
    estimated_on(config, table, land)
    return True


def plan_arm(land: GpuLandscape, config: TunerConfig, default: Arm) -> tuple[Arm, str]:
    """The default staged arm in the order the plan chooses under this SLO
    (tuner.study.loop.order, as a study with estimates runs it), and the order's line."""
    s, groups = default
    cfg = copy.deepcopy(config)
    cfg.search_space = categorical_space(land, groups)
    cfg.study.stages = list(s.stages or groups)
    cfg.study.trials_per_stage = s.trials_per_stage
    cfg.slo.p99_e2e_s = 0.0  # as run_study sets it below: the GPU studies bound TTFT and TPOT
    choice = choose_order(Planner(cfg), cfg, cfg.objectives.select_by)
    stages = choice.order if choice is not None else tuple(cfg.study.stages)
    name = f"staged_tpe_{s.trials_per_stage}_plan"
    line = choice.line() if choice is not None else "the plan has nothing to choose"
    return (replace(s, name=name, stages=stages), groups), line


def replay(
    land: GpuLandscape,
    slo: GpuSlo,
    seeds: int,
    arms: Sequence[Arm],
    table: silicon.SiliconTable | None = None,
    name: str = "",
) -> dict[str, Any]:
    """Every arm on every seed; ``table``: the silicon table a prescreened arm estimates;
    ``name``: the landscape's, whose plan (where it can be estimated) orders one more arm."""
    ref = reference(land, slo)
    base = gpu_config(land, slo)
    screened = copy.deepcopy(base)
    if table is not None:
        estimated_on(screened, table, land)
    planned = copy.deepcopy(base)
    order_line, alias = "", ""
    if name and planned_on(planned, name, land):
        arm, order_line = plan_arm(land, planned, arms[0])
        if arm[0].stages == arms[0][0].stages:  # the same strategy: its runs are the default's
            alias = arm[0].name
        else:
            arms = [arms[0], arm, *arms[1:]]
    rows = []
    clock: dict[str, float] = {}
    for seed in range(seeds):
        with lap(clock, WALKS):
            traces = plain_arms(land, seed, slo)
        for s, groups in arms:
            config = screened if s.prescreen else base
            with lap(clock, s.name):
                space = categorical_space(land, groups)
                traces.append(run_study(land, config, s, space, 0.0, seed))
        rows += [summarize_run(t, land, ref) for t in traces]
        if alias:  # the plan kept the default order: the same seeds ran the same study
            default = next(r for r in rows[::-1] if r["strategy"] == arms[0][0].name)
            rows.append({**default, "strategy": alias})
    summary = aggregate(rows, len(land.grid_keys()))
    for line in summary:
        mine = [r for r in rows if r["strategy"] == line["strategy"]]
        line["worse_than_defaults"] = handed_worse(mine, "worse_than_defaults")
        line["worse_than_defaults_3pct"] = handed_worse(mine, "worse_than_defaults_3pct")
        line["edge_flags"] = edge_flags(mine)
    per_seed = {name: round(t / max(seeds, 1), 2) for name, t in clock.items()}
    return {
        "reference": {**describe(land, ref), "plan_order": order_line},
        "summary": summary,
        "seconds_per_seed": per_seed,
        "runs": rows,
    }


WALKS = "walks"  # defaults, grid and random walk together: lookups only, milliseconds a seed


@contextlib.contextmanager
def lap(clock: dict[str, float], name: str) -> Iterator[None]:
    """Adds the block's wall time to ``clock[name]``: what an arm costs a seed, so that a lead
    can size the 20-seed runs before starting them."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        clock[name] = clock.get(name, 0.0) + time.monotonic() - t0


def describe(land: GpuLandscape, ref: GpuReference) -> dict[str, Any]:
    return {
        **asdict(ref),
        "best_config": land.params_of(ref.best_key),
        "cv": land.cv,
        "grid_size": len(land.grid_keys()),
        "defaults": land.params_of(land.key({})),
        "failed_starts": sum(not land.true(k).ok for k in land.grid_keys()),
    }


def landscape_rows(land: GpuLandscape, slo: GpuSlo) -> list[dict[str, Any]]:
    rows = []
    for key in land.grid_keys():
        m = land.true(key)
        rows.append(
            {
                **land.params_of(key),
                "ok": m.ok,
                "feasible": slo.met(m),
                "tok_s_per_gpu": round(land.per_gpu(key), 1),
                "tok_s_per_user": round(land.per_user(key), 1),
                "p99_ttft_s": None if m.p99_ttft_s is None else round(m.p99_ttft_s, 3),
                "p99_tpot_s": None if m.p99_tpot_s is None else round(m.p99_tpot_s, 4),
            }
        )
    return sorted(rows, key=lambda r: (not r["feasible"], -r["tok_s_per_gpu"]))


COLUMNS = [
    "strategy",
    "reached_97",
    "median_trials_to_97",
    "median_trials_to_97_pct_of_grid",
    "median_trials_to_97_seen",
    "median_final_score",
    "final_feasible",
    "worse_than_defaults",
    "worse_than_defaults_3pct",
    "switched_worse",
    "edge_flags",
    "median_launches",
    "median_hv_at_5",
    "median_hv_at_10",
    "median_hv_at_20",
]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--landscape", required=True, help="an estimated system or a silicon table")
    p.add_argument("--cv", type=float, nargs="+", default=[0.0, 0.02, 0.05])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--staged-trials", type=int, default=6, help="study.trials_per_stage, staged")
    p.add_argument("--joint-trials", type=int, default=24, help="study.trials_per_stage, joint")
    p.add_argument(
        "--orders",
        nargs="+",
        default=["quantization,parallelism,memory,batching,quantization"],
        help="stage orders of the staged arms, comma-separated; the first is the default",
    )
    p.add_argument(
        "--refine-trials",
        type=int,
        default=0,
        help="also the default order with a last joint stage of this many trials",
    )
    p.add_argument(
        "--prescreen",
        action="store_true",
        help="each staged arm also with the plan's pre-screen (silicon tables only)",
    )
    p.add_argument("--slo-ttft", type=float, default=None, help="P99 TTFT SLO (s); default median")
    p.add_argument("--slo-tpot", type=float, default=None, help="P99 TPOT SLO (s); default median")
    p.add_argument(
        "--slo-levels",
        type=slo_levels,
        default=None,
        help="percentiles, comma-separated (e.g. 25,50,75): each replays with the P99 TTFT and "
        "P99 TPOT SLOs at that percentile of the P99s of the configurations that start, into "
        "<out>/slo_p<level>/cv_<cv>/ (default: the median, into <out>/cv_<cv>/)",
    )
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def slo_levels(text: str) -> list[float]:
    try:
        levels = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(not 0 <= q <= 100 for q in levels):
        raise argparse.ArgumentTypeError(f"comma-separated percentiles in [0, 100]: {text!r}")
    return levels


SLO_FOLDER = "slo_p"  # slo_p<level>: one folder per SLO level (benchmarks.gpu_replay_table)


def level_folder(level: float) -> str:
    return f"{SLO_FOLDER}{level:g}"


@dataclass(frozen=True)
class SloCase:
    """One SLO a replay runs at, and where its results go under the landscape's folder."""

    folder: str  # "" (the layout before the levels) or slo_p<level>
    level: float | None  # its percentile; None where --slo-ttft or --slo-tpot set it
    slo: GpuSlo


def slo_cases(args: argparse.Namespace, land: GpuLandscape) -> list[SloCase]:
    if args.slo_levels is None:  # as before the levels: the median, or the SLOs given
        med = median_slo(land)
        slo = GpuSlo(args.slo_ttft or med.p99_ttft_s, args.slo_tpot or med.p99_tpot_s)
        level = None if args.slo_ttft or args.slo_tpot else 50.0
        return [SloCase("", level, slo)]
    if args.slo_ttft or args.slo_tpot:  # a level sets both: one of them given would be ignored
        raise SystemExit("--slo-levels sets both SLOs: leave out --slo-ttft and --slo-tpot")
    empty = [q for q in args.slo_levels if not any_feasible(land, percentile_slo(land, q))]
    if empty:  # said before any replay starts, not after the levels before it ran for an hour
        raise SystemExit(
            f"no configuration meets both SLOs at levels {empty}; "
            f"the lowest integer level some configuration meets: {lowest_level(land)}"
        )
    return [SloCase(level_folder(q), q, percentile_slo(land, q)) for q in args.slo_levels]


def any_feasible(land: GpuLandscape, slo: GpuSlo) -> bool:
    return any(slo.met(land.true(k)) for k in land.grid_keys())


def lowest_level(land: GpuLandscape) -> int | None:
    """Both SLOs at the same percentile: TTFT and TPOT favour different configurations, so a
    low level can leave none meeting both (llama8b_h100 at 25)."""
    return next((q for q in range(101) if any_feasible(land, percentile_slo(land, q))), None)


def run_cell(
    name: str,
    land: GpuLandscape,
    case: SloCase,
    seeds: int,
    arms: Sequence[Arm],
    table: silicon.SiliconTable | None,
    out: Path,
) -> None:
    """One (SLO, noise) cell: every arm on every seed, written to ``out``."""
    t0 = time.monotonic()
    result = replay(land, case.slo, seeds, arms, table, name)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["reference"]["slo_level"] = case.level
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    summary = markdown([{c: line[c] for c in COLUMNS} for line in result["summary"]])
    (out / "summary.md").write_text(summary + "\n")
    (out / "landscape.md").write_text(markdown(landscape_rows(land, case.slo)) + "\n")
    print(json.dumps(result["reference"], default=str))
    print(f"{out}: {result['elapsed_s']} s; s a seed: {result['seconds_per_seed']}")
    print(summary + "\n", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    land = load(args.landscape)
    cases = slo_cases(args, land)
    orders = [o.split(",") for o in args.orders]
    measured_on = silicon.TABLES.get(args.landscape) if args.prescreen else None
    if args.prescreen and measured_on is None:  # the estimator would be grading its own numbers
        raise SystemExit("--prescreen needs a silicon table: an estimated landscape is the plan's")
    arms = strategies(
        land, orders, args.staged_trials, args.joint_trials, args.refine_trials, args.prescreen
    )
    out_root = args.out or results("search_efficiency", "gpu", args.landscape)
    for case in cases:
        for cv in args.cv:
            out = out_root / case.folder / f"cv_{cv:g}"
            run_cell(args.landscape, land.with_noise(cv), case, args.seeds, arms, measured_on, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
