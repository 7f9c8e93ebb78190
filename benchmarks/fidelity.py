"""Does tuner measure what vLLM's own client measures? And how much load can one client drive?

``compare``: one vLLM-CPU server (started by tuner's own backend), the same workload driven
alternately by ``vllm bench serve`` (imported from the installed vLLM and run in a subprocess:
the ``vllm`` console script of vllm-cpu is broken) and by tuner's Locust load generator, in the
order A B B A A B B A ... so that a drift of the shared machine hits both clients alike. Both
send N completions of a fixed prompt length and a fixed output length (``ignore_eos``) with
the same number in flight, no warm-up, and by default the same prompts: a fresh set from
tuner's synthesizer per run, read by vLLM's client as a ``custom`` dataset (``--prompts own``
gives vLLM's client its ``random`` dataset, which repeats prompts on a small vocabulary and so
hits the server's prefix cache; the hit rate of every run is read from /metrics). Reported:
ours / vLLM's for P50/P99 TTFT, TPOT and E2E (vLLM's own reported percentiles against
tuner.measurement.stats's) and output tok/s, per pair and median.

Output tok/s is defined differently on purpose: vLLM divides every output token by the time from
the first send to the last completion (ramp-up and tail included); tuner divides the tokens of
requests started in the window by the window (to the last *start*; the tail drains outside it).
``output_tok_s_aligned`` applies vLLM's definition to tuner's own records, so a gap between the
two clients and a gap between the two definitions are told apart.

``headroom``: the SSE events/s one Locust process sustains (``benchmarks.headroom``).

``--server-cpus 0 --client-cpus 1`` gives each side cores of its own (a CPU server otherwise
computes on the cores its client uses): the server starts pinned, with vLLM's OpenMP threads
bound to the same cores (VLLM_CPU_OMP_THREADS_BIND), and both clients run pinned to the others.
The affinity each server thread really had is read back and reported.

    .venv/bin/python -m benchmarks.fidelity compare --rounds 4 --server-cpus 0 --client-cpus 1
    .venv/bin/python -m benchmarks.fidelity headroom

write to ``benchmarks/results/fidelity/<machine>/<variant>/`` unless ``--out`` says otherwise:
``pinned`` or ``shared`` (server and clients on every CPU), ``_own_prompts`` with ``--prompts
own``, and ``headroom``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import headroom
from benchmarks.layout import machine, results
from tuner import (
    LaunchSpec,
    LengthDist,
    LocustLoadGenerator,
    RequestClass,
    RequestRecord,
    SloConfig,
    Target,
    WorkloadConfig,
    build_plan,
    compose,
    counter_deltas,
    histogram_means,
    make_backend,
    over_server,
    pin,
    read_records,
    resolve,
    scrape,
    tree_cpus,
)

METRICS = ("ttft", "tpot", "e2e")
VLLM_NAME = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el"}
# vllm bench serve, from the installed package, with its own argument parser.
VLLM_BENCH = (
    "import json, resource, sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = FlexibleArgumentParser(); add_cli_args(p)\n"
    "def cpu():\n"
    "    u = resource.getrusage(resource.RUSAGE_SELF); return u.ru_utime + u.ru_stime\n"
    "c0 = cpu(); r = main(p.parse_args(sys.argv[2:])); r['client_cpu_s'] = cpu() - c0\n"
    "keep = {k: v for k, v in r.items() if not isinstance(v, list) or k in "
    "('ttfts', 'latencies', 'output_lens', 'start_times', 'errors')}\n"
    "open(sys.argv[1], 'w').write(json.dumps(keep, default=str))\n"
)


# ---- compare --------------------------------------------------------------------------------
def workload(args: argparse.Namespace) -> WorkloadConfig:
    cls = RequestClass(
        name="random",
        api="completions",
        prompt_tokens=LengthDist(kind="fixed", mean=args.input_len),
        output_tokens=LengthDist(kind="fixed", mean=args.output_len),
    )
    return WorkloadConfig(
        classes=[cls],
        mode="closed",
        concurrency=args.concurrency,
        warmup_s=0.0,
        window_s=3600.0,
        max_requests=args.num_prompts,
        request_timeout_s=300.0,
        drain_timeout_s=300.0,
    )


def prompts_file(args: argparse.Namespace, target: Target, out: Path, seed: int) -> Path:
    """``num_prompts`` distinct prompts from tuner's synthesizer, a fresh set for every run, as
    JSONL that both clients read: the same kind of text, and no run finds its prompts in the
    server's prefix cache (vLLM's ``random`` dataset repeats prompts on a small vocabulary)."""
    wl = workload(args)
    wl.seed = seed
    path = out / f"prompts-{seed}.jsonl"
    rows = (
        {"prompt": r.prompt, "max_tokens": r.max_tokens}
        for r in build_plan(wl, target.tokenizer, size=args.num_prompts)
    )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def dataset_argv(args: argparse.Namespace, prompts: Path | None) -> list[str]:
    """vllm bench serve's prompts: the shared file, or its own ``random`` dataset."""
    if prompts is None:
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(args.input_len),
            "--random-output-len",
            str(args.output_len),
            "--random-range-ratio",
            "0",
        ]
    return [
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts),
        "--disable-shuffle",
        "--custom-output-len",
        str(args.output_len),
        "--skip-chat-template",
    ]


def run_vllm_bench(
    args: argparse.Namespace, target: Target, out: Path, seed: int, prompts: Path | None
) -> dict[str, float]:
    result_path = out / f"vllm-{seed}.json"
    argv = [
        "--backend",
        "vllm",
        "--base-url",
        target.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        target.model,
        "--tokenizer",
        target.tokenizer,
        *dataset_argv(args, prompts),
        "--num-prompts",
        str(args.num_prompts),
        "--max-concurrency",
        str(args.concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-detailed",  # keeps the per-request lists in the returned result
    ]
    env = dict(os.environ, OPENAI_API_KEY=target.api_key or "", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-c", VLLM_BENCH, str(result_path), *argv]
    with (out / f"vllm-{seed}.log").open("wb") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=900)
    r = json.loads(result_path.read_text())
    row = {"output_tok_s": float(r["output_throughput"]), "completed": float(r["completed"])}
    # Little's law: the mean number of requests in flight the client really kept.
    row["mean_inflight"] = sum(x for x in r["latencies"] if x) / float(r["duration"])
    row["client_cpu_s"] = float(r["client_cpu_s"])  # main() only: not the imports
    spans = [(s, s + x) for s, x in zip(r["start_times"], r["latencies"], strict=True) if x]
    row["steady_inflight"] = steady_inflight(spans)
    for m in METRICS:
        for p in ("mean", "p50", "p99"):
            key = f"{'median' if p == 'p50' else p}_{VLLM_NAME[m]}_ms"
            row[f"{p}_{m}_s"] = float(r[key]) / 1000
    return row


def run_ours(
    target: Target, wl: WorkloadConfig, out: Path, seed: int, prompts: Path | None
) -> dict[str, float]:
    wl.seed, wl.dataset = seed, str(prompts) if prompts else None
    folder = out / f"ours-{seed}"
    cpu0 = _children_cpu_s()
    result = LocustLoadGenerator().run(target, wl, folder)
    client_cpu_s = _children_cpu_s() - cpu0  # the Locust process, its start-up included
    records = list(read_records(result.records_path))
    m = headroom.measure_window(records, result.window_start, result.window_end, SloConfig())
    row = {"output_tok_s": m.output_throughput, "completed": float(m.completed)}
    row["client_cpu_s"] = client_cpu_s
    for name in METRICS:
        stats = getattr(m, name)
        row[f"mean_{name}_s"], row[f"p50_{name}_s"], row[f"p99_{name}_s"] = (
            stats.mean,
            stats.p50,
            stats.p99,
        )
    done = [r for r in records if r.ok and r.e2e_s is not None]
    span = max(r.sent_at + (r.e2e_s or 0) for r in done) - min(r.sent_at for r in done)
    row["output_tok_s_aligned"] = sum(r.output_tokens or 0 for r in done) / span
    row["mean_inflight"] = sum(r.e2e_s or 0 for r in done) / span
    row["steady_inflight"] = steady_inflight(
        [(r.sent_at, r.sent_at + (r.e2e_s or 0)) for r in done]
    )
    row.update(user_idle(records))
    return row


def user_idle(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Where a closed-loop user's time goes besides token streaming: the tail after the last
    token (usage chunk, [DONE]) and the idle gap before its next send (median, in ms)."""
    by_user: dict[str, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: r.sent_at):
        by_user.setdefault(r.user, []).append(r)
    tails = [r.done_at - r.finished_at for r in records if r.done_at and r.finished_at]
    gaps = [
        b.sent_at - a.done_at
        for mine in by_user.values()
        for a, b in itertools.pairwise(mine)
        if a.done_at
    ]
    return {
        "tail_after_last_token_ms": float(np.median(tails)) * 1000 if tails else math.nan,
        "idle_before_next_send_ms": float(np.median(gaps)) * 1000 if gaps else math.nan,
    }


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished, waited-for children (Locust, not the server)."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def steady_inflight(spans: Sequence[tuple[float, float]]) -> float:
    """Mean requests in flight over the middle half of the run (no ramp-up, no tail)."""
    start, end = np.array([s for s, _ in spans]), np.array([e for _, e in spans])
    t0, t1 = start.min(), end.max()
    ts = np.linspace(t0 + 0.25 * (t1 - t0), t1 - 0.25 * (t1 - t0), 2000)
    return float(np.mean([np.count_nonzero((start <= t) & (t < end)) for t in ts]))


def compare(args: argparse.Namespace) -> dict[str, Any]:
    config = compose(args.overrides)
    if args.server_cpus:  # vLLM-CPU binds its OpenMP threads itself: tell it where
        config.server.env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, args.server_cpus))
    wl = workload(args)
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        out = Path(tmp)
        # started there, as tuner's placement does
        launch = resolve(LaunchSpec(cpus=args.server_cpus), config.server)
        server = make_backend(config.server, launch, out / "server.log")
        with server:  # starts it; stops and reaps it on the way out, whatever happens
            info = server.wait_ready(time.monotonic() + config.server.startup_timeout_s)
            pin(0, args.client_cpus)  # this process starts both clients from here on
            server_cpus = tree_cpus(info.pid)
            print(
                f"server threads on CPUs {server_cpus}, clients on "
                f"{sorted(os.sched_getaffinity(0))}",
                flush=True,
            )
            target = Target(info.base_url, server.api_key, config.server.model, config.server.model)
            pairs = ab_rounds(args, target, wl, out)
    return {
        "workload": {
            "input_len": args.input_len,
            "output_len": args.output_len,
            "concurrency": args.concurrency,
            "num_prompts": args.num_prompts,
        },
        "server_args": launch.flags,
        "pairs": pairs,
        "median_ratio": median_ratios(pairs),
        "server_thread_cpus": server_cpus,
        "client_cpus": args.client_cpus or "all",
        "prompts": args.prompts,
    }


def ab_rounds(
    args: argparse.Namespace, target: Target, wl: WorkloadConfig, out: Path
) -> list[dict[str, Any]]:
    """Rounds of A B, B A, ...: a drift of the shared machine hits both clients alike."""
    pairs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = ("vllm", "ours") if rnd % 2 == 0 else ("ours", "vllm")
        row: dict[str, Any] = {"round": rnd, "order": "/".join(order)}
        for who in order:
            seed = 100 * rnd + (1 if who == "ours" else 2)
            prompts = prompts_file(args, target, out, seed) if args.prompts == "shared" else None
            t0, before = time.monotonic(), scrape(target.base_url, target.api_key)
            row[who] = (
                run_vllm_bench(args, target, out, seed, prompts)
                if who == "vllm"
                else run_ours(target, wl, out, seed, prompts)
            )
            row[who].update(server_view(row[who], before, scrape(target.base_url, target.api_key)))
            print(
                f"round {rnd} {who}: {_fmt(row[who])} ({time.monotonic() - t0:.0f} s)", flush=True
            )
        row["ratio"] = ratios(row["ours"], row["vllm"])
        pairs.append(row)
    return pairs


def server_view(
    client: dict[str, float], before: dict[str, float], after: dict[str, float]
) -> dict[str, float]:
    """What the server saw of the same requests, from its /metrics before and after the run:
    the prefix-cache hit rate, its own mean TTFT, TPOT and E2E, and the client's mean of each
    over the server's (``tpot_over_server`` 1.0: the client timed what the server did). A
    difference between the clients that the server saw too is the server's, not a client's."""
    out = {
        "prefix_cache_hit_rate": counter_deltas(before, after).get(
            "prefix_cache_hit_rate", math.nan
        )
    }
    means = histogram_means(before, after)
    ratios = over_server({m: client[f"mean_{m}_s"] for m in METRICS}, means)
    for m, ratio in ratios.items():
        out[f"server_{m}_mean_s"] = means[f"server_{m}_mean_s"]
        out[f"{m}_over_server"] = ratio
    return out


def ratios(ours: dict[str, float], vllm: dict[str, float]) -> dict[str, float]:
    skip = ("completed", "prefix_cache_hit_rate")  # not a measurement of the client
    out = {k: round(ours[k] / vllm[k], 4) for k in vllm if k not in skip and vllm[k]}
    out["output_tok_s_aligned"] = round(ours["output_tok_s_aligned"] / vllm["output_tok_s"], 4)
    return out


def median_ratios(pairs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    keys = list(pairs[0]["ratio"])
    out = {}
    for k in keys:
        vals = [p["ratio"][k] for p in pairs]
        out[k] = {"median": round(statistics.median(vals), 4), "min": min(vals), "max": max(vals)}
    return out


def _fmt(row: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in row.items())


# ---- CLI ------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="default: see the module's docstring")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="tuner's client vs vllm bench serve on one server")
    c.add_argument("--rounds", type=int, default=4, help="A/B pairs (order alternates)")
    c.add_argument("--num-prompts", type=int, default=320)
    c.add_argument("--concurrency", type=int, default=16)
    c.add_argument("--input-len", type=int, default=256)
    c.add_argument("--output-len", type=int, default=64)
    c.add_argument(
        "--prompts",
        choices=("shared", "own"),
        default="shared",
        help="shared: the same synthesized prompts to both clients, fresh per run; "
        "own: vLLM's random dataset against tuner's synthesizer",
    )
    c.add_argument("--server-cpus", type=int, nargs="+", help="pin the server to these CPUs")
    c.add_argument("--client-cpus", type=int, nargs="+", help="pin both clients to these CPUs")
    c.add_argument("overrides", nargs="*", help="Hydra overrides for the server")
    h = sub.add_parser("headroom", help="events/s one Locust process sustains (fake server)")
    h.add_argument("--users", type=int, nargs="+", default=[4, 16, 32, 64, 128])
    h.add_argument("--ttft", type=float, default=0.05)
    h.add_argument("--itl", type=float, default=0.005)
    h.add_argument("--output-len", type=int, default=64)
    h.add_argument("--window", type=float, default=10.0)
    h.add_argument("--shift-ms", type=float, default=5.0)
    return p.parse_args(argv)


def variant(args: argparse.Namespace) -> str:
    """The results folder of a run: headroom, or where the sides ran and whose prompts."""
    if args.command != "compare":
        return "headroom"
    where = "pinned" if args.server_cpus or args.client_cpus else "shared"
    return where + ("_own_prompts" if args.prompts == "own" else "")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = compare(args) if args.command == "compare" else headroom.headroom(args)
    out = args.out or results("fidelity", machine(), variant(args))
    out.mkdir(parents=True, exist_ok=True)
    name = "fidelity.json" if args.command == "compare" else "client_headroom.json"
    result["machine_loadavg_at_end"] = os.getloadavg()
    (out / name).write_text(json.dumps(result, indent=1, default=str) + "\n")
    summary = result.get("median_ratio") or result.get("sustained_events_per_s")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
