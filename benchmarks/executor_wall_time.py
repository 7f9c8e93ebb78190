"""How much faster is one TP-mixed stage on an 8-GPU node with trials in parallel, and what
does the Ray executor cost per trial?

The real executor code runs: tuner's StudyRunner with ``study.executor=ray`` starts a local Ray
instance declaring 8 GPUs (Ray schedules and assigns them for real; the host needs none), asks
the stage's sampler, submits each trial as a Ray task with its placement group, brings its
result back and tells it. Only the trial itself is a table: it sleeps for its configuration's
start-up plus measurement (``STARTUP_S`` by tensor-parallel size + ``MEASURE_S``, in table
seconds, scaled by ``--scale`` to keep the run short) and returns that configuration's numbers.

Reported, per sampler and objective:

- the stage's wall time (its first trial asked -> its last told, from the storage), in table
  seconds, against the same stage run serially (``study.executor=local``) and against the sum
  of the parallel run's own launches (what one GPU-set at a time would have taken for them);
- idle GPU-seconds: 1 - (sum of TP x run time) / (8 x wall time);
- the best ratio any scheduler could reach for that TP mix (sum of durations over
  max(sum of TP x duration / 8, longest trial));
- the driver's overhead per trial (seconds outside the trial itself), local vs Ray, from K
  serial trials of a fixed length: wall per trial minus the trial's sleep.

The storage is SQLite in /dev/shm (as in the replays): on a busy disk each of a trial's ~65
attribute commits waits for fsync, which is the driver's cost on any executor, not Ray's.

The Ray instance is started once, its workers warmed, and shared by the runs: a fresh one
spends its first seconds starting worker processes, nothing next to minutes-long trials.

    .venv/bin/python -m benchmarks.executor_wall_time  # -> results/executor/<machine>/
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from benchmarks.layout import machine, results
from tuner import (
    Evaluator,
    ParamSpec,
    ResolvedLaunch,
    SamplerConfig,
    StudyRunner,
    TrialAttr,
    TrialOutcome,
    TunerConfig,
)
from tuner.testing.landscape import Measured
from tuner.testing.lookup import SCRATCH, count_fallbacks, outcome_of

GPUS = 8
# Table seconds: a Llama-8B-class server on H100s (weights from local disk, CUDA graphs): more
# ranks start more processes and a longer NCCL set-up. Measurement: 30 s warm-up + 120 s window.
STARTUP_S = {1: 90.0, 2: 100.0, 4: 120.0, 8: 150.0}
MEASURE_S = 150.0
TP_CHOICES = [1, 2, 4, 8]
SEQS_CHOICES = [16 * (i + 1) for i in range(16)]  # enough points for 32 distinct launches
PRICE = {"H100": 2.99}
# (name, sampler, TP choices): the stage as a sampler explores it. The samplers weigh every
# objective (latency, throughput, cost), so the TP mix is theirs; a uniform one (random) is
# what an exploring stage launches, a TP 1-2 stage what a small model's does.
VARIANTS = [
    ("tp1248-random", "random", [1, 2, 4, 8]),
    ("tp1248-tpe", "tpe", [1, 2, 4, 8]),
    ("tp12-random", "random", [1, 2]),
]


def trial_s(tp: int) -> float:
    return STARTUP_S[tp] + MEASURE_S


def table_trial(
    config: TunerConfig,
    launch: ResolvedLaunch,
    paths: Any,
    trial_id: str,
    progress: Any = None,
    scale: float = 0.015,
) -> TrialOutcome:
    """The trial of ``launch``: its table duration (scaled), then its table numbers."""
    args = launch.flags
    tp, seqs = int(args.get("tensor_parallel_size") or 1), int(args.get("max_num_seqs") or 256)
    time.sleep(trial_s(tp) * scale)
    # Throughput grows with TP sub-linearly and saturates with the batch; latency with the batch
    tok_s = 2400.0 * tp**0.8 * seqs / (seqs + 96)
    p99 = 1.5 + seqs / (400.0 * tp**0.5)
    measured = Measured(
        True, "", p99 / 2, p99, 0.05, 0.2, 0.02, 0.03, tok_s, tok_s / 200, 0.0, 600, 0
    )
    return outcome_of(measured, launch.record(), trial_id)


def stage_config(
    folder: Path, executor: str, sampler: str, tps: list[int], seed: int, trials: int
) -> TunerConfig:
    config = TunerConfig(
        name=f"wall-{executor}-{sampler}-{len(tps)}-{seed}", studies_dir=str(folder)
    )
    config.server.device, config.server.model = "cuda", "table"
    config.server.args = {}
    config.search_space = {
        "parallelism": {
            "tensor_parallel_size": ParamSpec(type="categorical", choices=list(tps)),
            "max_num_seqs": ParamSpec(type="categorical", choices=list(SEQS_CHOICES)),
        }
    }
    study = config.study
    study.stages, study.trials_per_stage, study.repeats = ["parallelism"], trials, 0
    study.baseline_measurements, study.reuse, study.seed = 1, False, seed
    study.executor, study.parallel = executor, ("auto" if executor == "ray" else "1")
    study.max_consecutive_failures, study.max_failure_rate = 10_000, 1.0
    config.ray.num_gpus, config.ray.num_cpus = GPUS, 4 * GPUS  # cores never the limit here
    config.sampler = SamplerConfig(sampler, n_startup_trials=4)
    config.objectives.names = ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
    config.objectives.select_by = "output_throughput"
    config.cost.gpu_hour, config.cost.gpu_model = dict(PRICE), "H100"
    config.slo.p99_e2e_s = 10.0
    config.quality.enabled = False
    return config


def run_stage(config: TunerConfig, scale: float) -> dict[str, Any]:
    """Run the study; the stage's trials as the storage has them."""
    trial_fn = functools.partial(table_trial, scale=scale)
    runner = StudyRunner(
        config, Evaluator(config, "H100"), {"bench": config.name}, _quiet, trial_fn=trial_fn
    )
    with count_fallbacks():
        runner.run()
    storage = f"sqlite:///{config.studies_dir}/{config.name}/optuna.db"
    stage = optuna.load_study(study_name=f"{config.name}:parallelism", storage=storage)
    trials = [
        t
        for t in stage.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(TrialAttr.ROLE) == "search"
    ]
    assert all(t.user_attrs.get(TrialAttr.STATUS) == "ok" for t in trials)
    start = min(t.datetime_start for t in trials if t.datetime_start)
    end = max(t.datetime_complete for t in trials if t.datetime_complete)
    wall = (end - start).total_seconds()
    tps = [int(t.params["tensor_parallel_size"]) for t in trials]
    ran = [_ran(t) for t in trials]
    return {
        "wall_s": wall / scale,
        "tps": tps,
        "ran_s": [r / scale for r in ran],
        "launches": len(trials),
    }


def _ran(trial: optuna.trial.FrozenTrial) -> float:
    devices = trial.user_attrs.get("devices")
    if devices:
        return float(devices["ended_at"] - devices["started_at"])
    timings = trial.user_attrs.get(TrialAttr.TIMINGS) or {}
    return float(timings.get("total", 0.0))


def figures(parallel: dict[str, Any], serial: dict[str, Any]) -> dict[str, Any]:
    tps, wall = parallel["tps"], parallel["wall_s"]
    durations = [trial_s(tp) for tp in tps]
    gpu_s = sum(tp * d for tp, d in zip(tps, durations, strict=True))
    best_wall = max(gpu_s / GPUS, max(durations))
    return {
        "launches": parallel["launches"],
        "tp_mix": {str(tp): tps.count(tp) for tp in TP_CHOICES},
        "parallel_wall_s": round(wall),
        "serial_wall_s": round(serial["wall_s"]),
        "ratio_vs_serial_run": round(serial["wall_s"] / wall, 2),
        "ratio_vs_same_launches": round(sum(durations) / wall, 2),
        "best_possible_ratio_for_this_mix": round(sum(durations) / best_wall, 2),
        "idle_gpu_fraction": round(1 - gpu_s / (GPUS * wall), 3),
    }


def overhead(folder: Path, trials: int, seconds: float) -> dict[str, float]:
    """Seconds per trial outside the trial itself: K serial trials of ``seconds`` each."""
    out = {}
    for executor in ("local", "ray"):
        config = stage_config(folder, executor, "random", [1], 0, trials)
        config.name = f"overhead-{executor}"
        config.study.parallel = "1"
        scale = seconds / trial_s(1)
        run = run_stage(config, scale)
        out[executor] = round(run["wall_s"] * scale / run["launches"] - seconds, 3)
    return out


def _quiet(_message: str) -> None:
    return None


@contextmanager
def local_ray() -> Iterator[None]:
    """A local Ray on 127.0.0.1 declaring the node's 8 GPUs, its workers started."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only (tuner does the same)
    import ray

    ray.init(num_gpus=GPUS, num_cpus=4 * GPUS, include_dashboard=False, log_to_driver=False)

    @ray.remote
    def warm() -> int:
        from tuner import TrialOutcome  # noqa: F401  (most of what a trial's worker imports)

        time.sleep(1.0)
        return os.getpid()

    try:
        ray.get([warm.options(num_cpus=1).remote() for _ in range(2 * GPUS)])
        yield
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.02, help="real seconds per table second")
    ap.add_argument("--trials", type=int, default=32, help="launches of the stage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/executor/<machine>")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    report: dict[str, Any] = {
        "gpus": GPUS,
        "scale": args.scale,
        "startup_s": STARTUP_S,
        "measure_s": MEASURE_S,
        "runs": {},
    }
    scratch = tempfile.TemporaryDirectory(prefix="executor-bench-", dir=SCRATCH)
    with scratch as tmp, local_ray():
        for name, sampler, tps in VARIANTS:
            runs = {
                ex: run_stage(
                    stage_config(Path(tmp), ex, sampler, tps, args.seed, args.trials), args.scale
                )
                for ex in ("ray", "local")
            }
            report["runs"][name] = figures(runs["ray"], runs["local"])
            print(name, json.dumps(report["runs"][name]), flush=True)
        report["overhead_per_trial_s"] = overhead(Path(tmp), trials=8, seconds=1.0)
    print("overhead per trial", report["overhead_per_trial_s"])
    out = args.out or results("executor", machine())
    out.mkdir(parents=True, exist_ok=True)
    (out / "executor_wall_time.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {out / 'executor_wall_time.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
