"""Replay search strategies against a measured table instead of starting servers.

A "trial" looks its configuration up in a table of real measurements (benchmarks.measure_grid)
and returns one of that configuration's repeats, drawn at random, so the strategies see the real
run-to-run noise. The staged and joint strategies are tuner's own :class:`tuner.StudyRunner`
(samplers from the registry, search_space, evaluation, the acceptance rule, a real Optuna
storage) with the lookup as its ``trial_fn`` (tuner.testing.lookup) instead of
:func:`tuner.run_trial`.
The full grid in vLLM auto_tune's order, and vLLM's defaults alone, need no sampler and are
plain loops.

Each run is scored against the table's *truth* (every configuration's mean over its repeats):

- selection: what the run would hand over after t launches (for StudyRunner strategies, the
  incumbent: accepted decisions only; for the others, the best feasible observed launch), scored
  as its true select_by value / the grid's best feasible one, 0 when truly infeasible;
- trials to 97 %: the first t whose selection scores >= 0.97;
- hypervolume after t launches: the true (P99 E2E, output tok/s) of every configuration launched
  so far (failed ones excluded), relative to the hypervolume of the whole grid.

    .venv/bin/python -m benchmarks.replay     # the first table, the README's strategies
    .venv/bin/python -m benchmarks.replay --csv benchmarks/data/grid_vllm_cpu_avx512.csv \
        --stages runtime batching --only staged

writes ``replay.json``, ``replay_summary.md`` and ``landscape.md`` to
``benchmarks/results/search_efficiency/replay/<table>[_slo_<s>]_<first stage>_first/`` unless
``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.layout import DATA, ROOT, results, table_id
from benchmarks.scoring import aggregate, best_observed, markdown, summarize_run
from tuner import NOISE_RULES, TunerConfig
from tuner.testing.landscape import Landscape, landscape_rows, median_slo, reference
from tuner.testing.lookup import StudyStrategy, base_config, categorical_space, quiet, run_study
from tuner.testing.run_trace import Launch, RunTrace

DEFAULT_CSV = DATA / "grid_vllm_cpu.csv"


# ---- a run ------------------------------------------------------------------------------
def run_defaults(land: Landscape, slo: float, seed: int) -> RunTrace:
    rng = np.random.default_rng(seed)
    key = land.key({})
    trace = RunTrace("defaults", seed, [Launch("defaults", key, land.draw(key, rng))])
    trace.selected = best_observed(trace.launches, land, slo)
    return trace


def run_grid(land: Landscape, slo: float, seed: int) -> RunTrace:
    rng = np.random.default_rng(seed)
    launches = [Launch("grid", k, land.draw(k, rng)) for k in land.grid_keys()]
    trace = RunTrace("grid", seed, launches)
    trace.selected = best_observed(launches, land, slo)
    return trace


# ---- the benchmark -----------------------------------------------------------------------
def default_strategies(
    joint_trials: Sequence[int],
    staged_trials: Sequence[int],
    refine_trials: int,
    staged_samplers: Sequence[str] = ("tpe",),
) -> list[StudyStrategy]:
    """Tuner's staged search with each sampler at each stage budget (with and without the final
    joint refinement), and every sampler over the joint space at each budget."""
    out = []
    for sampler, n in itertools.product(staged_samplers, staged_trials):
        out.append(StudyStrategy(f"staged_{sampler}_{n}", "staged", sampler, n))
        if refine_trials:
            out.append(
                StudyStrategy(
                    f"staged_{sampler}_{n}_refine_{refine_trials}",
                    "staged",
                    sampler,
                    n,
                    refine_trials=refine_trials,
                )
            )
    for n in joint_trials:
        out += [
            StudyStrategy(f"joint_tpe_{n}", "joint", "tpe", n),
            StudyStrategy(f"joint_gp_{n}", "joint", "gp", n),
            # population 6: generations of 6 (conf/sampler/nsga2.yaml explains why).
            StudyStrategy(f"joint_nsga2_{n}", "joint", "nsga2", n, 2, 0, {"population_size": 6}),
            StudyStrategy(f"joint_random_{n}", "joint", "random", n, 2, 0),
        ]
    return out


# --search-window: whether the acceptance rule counts the stage winner's search window
SEARCH_WINDOW = {"count": True, "drop": False}

# Named sets for --only: the strategies the README's figures replay, so that each figure's
# command stays one line. "standard" is every sampler staged and joint at the budgets the
# README compares; "acceptance" the four whose hand-overs the acceptance settings change.
STAGED = [f"staged_{s}_{n}" for s in ("tpe", "gp") for n in ("4", "8", "4_refine_4")]
STRATEGY_SETS: dict[str, list[str]] = {
    "standard": [*STAGED, *(f"joint_{s}_10" for s in ("tpe", "gp", "nsga2", "random"))],
    "staged": STAGED,
    "staged_4": ["staged_tpe_4", "staged_gp_4"],
    "acceptance": ["staged_tpe_4", "staged_gp_4", "joint_tpe_10", "joint_gp_10"],
}


def chosen(strategies: Sequence[StudyStrategy], only: Sequence[str]) -> list[StudyStrategy]:
    """The strategies named in ``only`` (names or STRATEGY_SETS), in the order built; a name
    that these options do not build is an error, not an empty replay."""
    names = {n for name in only for n in STRATEGY_SETS.get(name, [name])}
    missing = names - {s.name for s in strategies}
    if missing:
        raise SystemExit(f"--only: {sorted(missing)} not built by these --*-trials/--*-samplers")
    return [s for s in strategies if s.name in names]


def with_settings(
    strategies: Sequence[StudyStrategy],
    rules: Sequence[str],
    windows: Sequence[str],
    repeats: int,
    baselines: int,
) -> list[StudyStrategy]:
    """Each strategy under each noise rule and search-window setting (named
    <strategy>[_<rule>][_drop] where they differ from the defaults pooled and count), with these
    repeats and baseline measurements."""
    return [
        replace(
            s,
            name=s.name
            + ("" if rule == "pooled" else f"_{rule}")
            + ("" if SEARCH_WINDOW[window] else "_drop"),
            noise=rule,
            count_search_window=SEARCH_WINDOW[window],
            repeats=repeats,
            baseline_measurements=baselines,
        )
        for window in windows
        for rule in rules
        for s in strategies
    ]


def replay(
    land: Landscape,
    base: TunerConfig,
    groups: Mapping[str, Sequence[str]],
    seeds: int,
    strategies: Sequence[StudyStrategy],
    slo: float | None = None,
    say: Callable[[str], None] = quiet,
) -> dict[str, Any]:
    """Run every strategy over ``seeds`` seeds; per-run rows and per-strategy medians."""
    ref = reference(land, slo if slo is not None else median_slo(land))
    space = categorical_space(land, groups)
    rows: list[dict[str, Any]] = []
    for seed in range(seeds):
        traces = [
            run_defaults(land, ref.slo_p99_e2e_s, seed),
            run_grid(land, ref.slo_p99_e2e_s, seed),
        ]
        for s in strategies:
            traces.append(run_study(land, base, s, space, ref.slo_p99_e2e_s, seed))
        rows.extend(summarize_run(t, land, ref) for t in traces)
        say(f"seed {seed + 1}/{seeds} done")
    grid = len(land.grid_keys())
    table = landscape_rows(land, ref.slo_p99_e2e_s)
    spreads = {k: [r[k] for r in table if r[k] is not None] for k in ("tok_s_spread", "p99_spread")}
    noise = {f"median_{k}": round(float(np.median(v)), 3) for k, v in spreads.items() if v}
    return {
        "landscape": table,
        "noise": noise,
        "reference": {
            **asdict(ref),
            "best_config": land.params_of(ref.best_key),
            "grid_size": grid,
        },
        "summary": aggregate(rows, grid),
        "runs": rows,
    }


def explain(
    land: Landscape,
    base: TunerConfig,
    groups: Mapping[str, Sequence[str]],
    strategies: Sequence[StudyStrategy],
    seeds: int,
    slo: float | None,
) -> int:
    """Why each run handed over what it did: its launches, observations and stage decisions."""
    ref = reference(land, slo if slo is not None else median_slo(land))
    space = categorical_space(land, groups)
    for seed in range(seeds):
        for s in strategies:
            print(run_study(land, base, s, space, ref.slo_p99_e2e_s, seed).explain())
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--out", type=Path, default=None, help="default: see the module's docstring")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument(
        "--throughput",
        default="output_token_rate",
        help="CSV column used as the output tok/s (the study's throughput objective)",
    )
    p.add_argument("--slo", type=float, default=None, help="P99 E2E SLO (s); default: median")
    p.add_argument(
        "--joint-trials",
        type=int,
        nargs="+",
        default=[10],
        help="study.trials_per_stage of the joint runs (each sampler at each value)",
    )
    p.add_argument(
        "--staged-trials",
        type=int,
        nargs="+",
        default=[4, 8],
        help="study.trials_per_stage of the staged runs (one strategy per value)",
    )
    p.add_argument(
        "--staged-samplers",
        nargs="+",
        default=["tpe", "gp"],
        help="samplers of the staged runs (each at each --staged-trials value)",
    )
    p.add_argument("--refine-trials", type=int, default=4, help="study.refine_trials; 0: none")
    p.add_argument(
        "--stages",
        nargs="+",
        choices=list(GROUPS),
        default=list(GROUPS),
        help="the staged runs' stage order (default: batching first, the order the first "
        "replays used; tuner's own default is runtime first)",
    )
    p.add_argument(
        "--only",
        nargs="+",
        default=["standard"],
        help=f"StudyRunner strategies to run, by name or set ({', '.join(STRATEGY_SETS)})",
    )
    # Acceptance settings: each value after the default replays every strategy again.
    for flag, values, key in (
        ("--noise", list(NOISE_RULES), "study.noise"),
        ("--search-window", list(SEARCH_WINDOW), "study.count_search_window"),
    ):
        p.add_argument(
            flag,
            nargs="+",
            choices=values,
            default=values[:1],
            help=f"{key} of the StudyRunner runs; each value after {values[0]!r} adds every "
            "strategy again, named <strategy>_<value>, on the same seeds",
        )
    p.add_argument("--repeats", type=int, default=2, help="study.repeats of the StudyRunner runs")
    p.add_argument(
        "--baseline-measurements",
        type=int,
        default=3,
        help="study.baseline_measurements of the StudyRunner runs (the quickstart: 2)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print each run's launches, observations and decisions; write nothing",
    )
    return p.parse_args(argv)


# The measured grid: tuner's stage groups (conf/search_space/batching.yaml, runtime.yaml).
GROUPS = {"batching": ["max_num_seqs", "max_num_batched_tokens"], "runtime": ["enforce_eager"]}


def default_out(csv: Path, stages: Sequence[str], slo: float | None) -> Path:
    """results/search_efficiency/replay/<table>[_slo_<s>]_<first stage>_first."""
    name = table_id(csv) + ("" if slo is None else f"_slo_{slo:g}")
    return results("search_efficiency", "replay", f"{name}_{stages[0]}_first")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    base = base_config()
    params = [p for ps in GROUPS.values() for p in ps]
    # A launch that leaves a flag out gets vLLM's default (the table's empty cells), except the
    # fixed server args (conf/server/vllm_cpu.yaml sets enforce_eager: true).
    defaults = {p: base.server.args.get(p) for p in params}
    land = Landscape.from_csv(args.csv, params, defaults, args.throughput)
    strategies = default_strategies(
        args.joint_trials, args.staged_trials, args.refine_trials, args.staged_samplers
    )
    strategies = chosen(strategies, args.only)
    strategies = with_settings(
        strategies, args.noise, args.search_window, args.repeats, args.baseline_measurements
    )
    groups = {g: GROUPS[g] for g in args.stages}  # the staged runs' stage order
    if args.explain:
        return explain(land, base, groups, strategies, args.seeds, args.slo)
    t0 = time.monotonic()
    result = replay(land, base, groups, args.seeds, strategies, args.slo, say=print)
    result["reference"]["throughput_column"] = args.throughput
    result["reference"]["stages"] = list(groups)
    result["reference"]["table"] = str(
        args.csv.relative_to(ROOT)
        if args.csv.is_absolute() and args.csv.is_relative_to(ROOT)
        else args.csv
    )
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    out = args.out or default_out(args.csv, args.stages, args.slo)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result["reference"].items()}, default=str))
    (out / "replay_summary.md").write_text(markdown(result["summary"]) + "\n")
    (out / "landscape.md").write_text(markdown(result["landscape"]) + "\n")
    print(json.dumps(result["noise"]))
    print(markdown(result["landscape"]))
    print(markdown(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
