"""The ``vllm:*`` metrics a simulated host exposes: the names and kinds vLLM's /metrics has,
so tuner's scrapes (tuner.telemetry.metrics) and a workload fit read them as from vLLM."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from tuner.simulation.engine import Engine, Sequence

# vLLM's own bucket edges for latencies (s) and token counts (a 1-2-5 series)
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
disable_created_metrics()  # vLLM's pages have no *_created samples
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))


class SimMetrics:
    """Prometheus metrics of one simulated server, labelled by model like vLLM's."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        reg = self.registry
        self.running = Gauge("vllm:num_requests_running", "running", labels, registry=reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=reg)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache in use", labels, registry=reg)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", labels, registry=reg)
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries", "prefix cache queries", labels, registry=reg
        )
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "prefix hits", labels, registry=reg)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens", labels, registry=reg)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "generated tokens", labels, registry=reg
        )
        self.success = Counter(
            "vllm:request_success", "finished", [*labels, "finished_reason"], registry=reg
        )
        self.hist = {
            name: Histogram(name, name, labels, buckets=LATENCY_BUCKETS, registry=reg)
            for name in (
                "vllm:time_to_first_token_seconds",
                "vllm:inter_token_latency_seconds",
                "vllm:request_time_per_output_token_seconds",
                "vllm:e2e_request_latency_seconds",
                "vllm:request_queue_time_seconds",
            )
        }
        for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
            self.hist[name] = Histogram(name, name, labels, buckets=TOKEN_BUCKETS, registry=reg)
        self.model = model
        for metric in (self.running, self.waiting, self.kv_usage, self.preemptions):
            metric.labels(model)
        for metric in (self.prefix_queries, self.prefix_hits, self.prompt_tokens):
            metric.labels(model)
        self.generation_tokens.labels(model)

    def observe(self, name: str, value: float) -> None:
        self.hist[name].labels(self.model).observe(value)

    def state(self, engine: Engine) -> None:
        self.running.labels(self.model).set(len(engine.running))
        self.waiting.labels(self.model).set(len(engine.waiting))
        self.kv_usage.labels(self.model).set(engine.kv_usage)

    def finished(self, seq: Sequence, ttft_s: float, e2e_s: float, queue_s: float) -> None:
        m = self.model
        self.success.labels(m, "length").inc()
        self.prompt_tokens.labels(m).inc(seq.prompt_tokens)
        self.prefix_queries.labels(m).inc(seq.prompt_tokens)
        self.generation_tokens.labels(m).inc(seq.generated)
        self.observe("vllm:time_to_first_token_seconds", ttft_s)
        self.observe("vllm:e2e_request_latency_seconds", e2e_s)
        self.observe("vllm:request_queue_time_seconds", queue_s)
        if seq.generated > 1:
            self.observe(
                "vllm:request_time_per_output_token_seconds",
                (e2e_s - ttft_s) / (seq.generated - 1),
            )
        self.observe("vllm:request_prompt_tokens", seq.prompt_tokens)
        self.observe("vllm:request_generation_tokens", seq.generated)

    def text(self) -> bytes:
        return generate_latest(self.registry)
