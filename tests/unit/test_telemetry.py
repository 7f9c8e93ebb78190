"""Telemetry: real child processes, a real HTTP /metrics endpoint, NVML absent (or present)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest

from tuner.config import TelemetryConfig
from tuner.errors import ConfigError
from tuner.telemetry import (
    CSV_COLUMNS,
    MetricsPoller,
    NvmlSampler,
    ProcessSampler,
    ScrapeError,
    Telemetry,
    TelemetrySummary,
    gpu_count,
    gpu_inventory,
    parse_metrics,
    scrape,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_metrics.txt"
BUSY = "import time\nt = time.time()\nwhile time.time() - t < 1.5:\n    pass"
IDLE = "import time; time.sleep(1.5)"
# A parent that idles while its child burns a core: CPU must be counted over the whole tree.
PARENT_OF_BUSY = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}])"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def _set_values(text: str, values: dict[str, float]) -> str:
    """The same exposition with the value of every sample named in ``values`` replaced."""
    lines = []
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not line.startswith("#") and name in values:
            line = f"{line.rsplit(' ', 1)[0]} {values[name]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class _MetricsHandler(BaseHTTPRequestHandler):
    bodies: ClassVar[list[str]] = []
    served: ClassVar[int] = 0
    auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        cls = type(self)
        body = cls.bodies[min(cls.served, len(cls.bodies) - 1)].encode()
        cls.served += 1
        cls.auth.append(self.headers.get("Authorization"))
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_MetricsHandler]]]:
    """A /metrics endpoint on 127.0.0.1 serving ``handler.bodies`` in order (last one repeats)."""
    handler = type("Handler", (_MetricsHandler,), {"bodies": [DATA.read_text()], "auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _closed_port_url() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------- process sampler


def test_process_sampler_counts_children_and_tells_busy_from_idle() -> None:
    sampler = ProcessSampler(interval_s=0.2)
    before, t0 = _children_cpu_s(), time.monotonic()
    busy, idle = _python(PARENT_OF_BUSY), _python(IDLE)
    sampler.watch("client", busy.pid)
    sampler.start()
    sampler.watch("idle", idle.pid)  # watching after start works too
    busy.wait(timeout=20)
    idle.wait(timeout=20)
    sampler.stop()
    # The truth from the kernel (rusage of reaped children), so a busy machine that gives the
    # loop less than a core does not fail the test; the sampler must agree with it.
    share = (_children_cpu_s() - before) / (time.monotonic() - t0)
    summary = sampler.summary()
    assert share > 0.1
    assert summary["client_cpu_mean_cores"] >= 0.6 * share
    assert summary["client_procs_max"] == 2
    assert summary["idle_cpu_mean_cores"] < 0.2
    assert summary["client_rss_max_mib"] > 1.0
    assert sampler.client_saturated(0.5 * share) is True
    assert sampler.client_saturated(0.5 * share, label="idle") is False
    assert any("client process" in w and "exited" in w for w in sampler.warnings)
    assert list(sampler.samples.columns) == ["t", "label", "cpu_cores", "rss_mib", "nprocs"]
    assert not sampler.running


def test_process_sampler_survives_a_vanished_pid() -> None:
    gone = _python("pass")
    gone.wait(timeout=20)
    sampler = ProcessSampler(interval_s=0.1)
    sampler.start()
    sampler.watch("client", gone.pid)
    sampler.stop()
    assert sampler.summary() == {}
    assert sampler.client_saturated(0.1) is False
    assert any(f"pid {gone.pid}" in w for w in sampler.warnings)


# ---------------------------------------------------------------- /metrics


def test_parse_realistic_vllm_metrics() -> None:
    values = parse_metrics(DATA.read_text())
    assert values["vllm:num_requests_running"] == 12.0
    assert values["vllm:num_requests_waiting"] == 3.0
    assert values["vllm:num_requests_waiting_by_reason"] == 3.0  # summed over reasons
    assert values["vllm:kv_cache_usage_perc"] == 0.4375
    assert values["vllm:num_preemptions_total"] == 2.0
    assert values["vllm:prefix_cache_queries_total"] == 20480.0
    assert values["vllm:prefix_cache_hits_total"] == 5120.0
    assert values["vllm:request_success_total"] == 80.0  # stop + length + abort
    assert values["vllm:time_to_first_token_seconds_count"] == 80.0
    assert values["vllm:time_to_first_token_seconds_sum"] == pytest.approx(10.32)
    assert not [k for k in values if k.endswith(("_bucket", "_created"))]


def test_scrape_over_http_sends_the_key(metrics_server: tuple[str, Any]) -> None:
    url, handler = metrics_server
    values = scrape(url, api_key="secret", timeout=5)
    assert values["vllm:kv_cache_usage_perc"] == 0.4375
    assert handler.auth == ["Bearer secret"]


def test_scrape_errors_are_tuner_errors(metrics_server: tuple[str, Any]) -> None:
    with pytest.raises(ScrapeError, match="cannot scrape"):
        scrape(_closed_port_url(), timeout=2)
    url, handler = metrics_server
    handler.bodies = ["<html>not metrics</html>"]
    with pytest.raises(ScrapeError, match="not valid Prometheus text"):
        scrape(url, timeout=5)


def _after_text() -> str:
    return _set_values(
        DATA.read_text(),
        {
            "vllm:num_requests_running": 20,
            "vllm:kv_cache_usage_perc": 0.9,
            "vllm:num_preemptions_total": 7,
            "vllm:prefix_cache_queries_total": 30720,
            "vllm:prefix_cache_hits_total": 10240,
            "vllm:time_to_first_token_seconds_count": 100,
            "vllm:time_to_first_token_seconds_sum": 12.32,
        },
    )


def test_poller_summary_uses_deltas(metrics_server: tuple[str, Any]) -> None:
    url, handler = metrics_server
    handler.bodies = [DATA.read_text(), _after_text()]
    poller = MetricsPoller(url, interval_s=60.0)  # only the start and stop scrapes happen
    poller.start()
    poller.stop()
    s = poller.summary()
    assert (s["scrapes"], s["scrape_failures"]) == (2.0, 0.0)
    assert (s["num_requests_running_max"], s["num_requests_running_mean"]) == (20.0, 16.0)
    assert s["kv_cache_usage_max"] == 0.9
    assert s["preemptions"] == 5.0
    assert s["prefix_cache_hit_rate"] == pytest.approx(5120 / 10240)
    assert s["server_ttft_mean_s"] == pytest.approx(2.0 / 20)
    assert set(poller.samples.columns) == {"t", "name", "value"}


def test_poller_summary_window_picks_bracketing_scrapes(metrics_server: tuple[str, Any]) -> None:
    url, handler = metrics_server
    third = _set_values(_after_text(), {"vllm:num_preemptions_total": 100})
    handler.bodies = [DATA.read_text(), _after_text(), third]
    poller = MetricsPoller(url, interval_s=60.0)
    poller._sample()
    time.sleep(0.01)
    between = time.time()
    time.sleep(0.01)
    poller._sample()
    poller._sample()
    assert poller.summary()["preemptions"] == 98.0  # 100 - 2 over all scrapes
    windowed = poller.summary(window=(between, between + 0.001))
    assert windowed["preemptions"] == 5.0  # 7 - 2: the scrapes just before and after
    first, second = (t for t, _ in poller.scrapes[:2])
    assert (windowed["deltas_from"], windowed["deltas_to"]) == (first, second)  # the span
    assert "num_requests_running_max" not in windowed  # no scrape inside the window


def test_failed_scrapes_are_recorded_not_raised() -> None:
    poller = MetricsPoller(_closed_port_url(), interval_s=60.0, timeout_s=1.0)
    poller.start()
    poller.stop()
    assert len(poller.failures) == 2
    assert poller.summary()["scrape_failures"] == 2.0
    assert any("scrape failed" in w and "(x2)" in w for w in poller.warnings)


# ---------------------------------------------------------------- NVML


def test_nvml_degrades_or_samples_for_real() -> None:
    sampler = NvmlSampler(interval_s=0.1)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    if gpu_count() == 0:  # this machine: no driver, NVML init fails
        assert gpu_inventory() == []
        assert not sampler.available and sampler.samples.empty
        assert sampler.summary() == {}
        assert any("NVML" in w or "nvidia-ml-py" in w for w in sampler.warnings)
    else:
        assert len(gpu_inventory()) == gpu_count()
        assert sampler.summary()["gpus"] == gpu_count()


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(t0: float) -> types.ModuleType:
    """Two GPUs; GPU 1 cannot report power (as some boards cannot). Stands in for a driver."""
    nv = types.ModuleType("pynvml")

    def power(h: int) -> int:
        if h == 1:
            raise _FakeNvmlError("Not Supported")
        return 100_000  # mW

    funcs: dict[str, Any] = {
        "NVMLError": _FakeNvmlError,
        "NVML_CLOCK_SM": 1,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlSystemGetDriverVersion": lambda: b"999.1",
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: f"Fake GPU {h}",
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=40 + 20 * h),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=2**30, total=2**34),
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetClockInfo": lambda h, clock: 1980,
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: (time.time() - t0) * 100_000,
    }
    for name, value in funcs.items():
        setattr(nv, name, value)
    return nv


def test_nvml_sampler_arithmetic_with_a_fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(time.time()))
    assert gpu_count() == 2
    assert gpu_inventory()[1] == {
        "index": 1,
        "name": "Fake GPU 1",
        "memory_total_mib": 16384.0,
        "driver": "999.1",
    }
    sampler = NvmlSampler(interval_s=0.05)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    frame = sampler.samples
    g0 = frame[frame["gpu"] == 0]
    duration = g0["t"].max() - g0["t"].min()
    s = sampler.summary()
    assert s["gpus"] == 2 and s["util_mean_pct"] == pytest.approx(50.0)
    assert s["gpu0_energy_j"] == pytest.approx(100.0 * duration)
    assert s["gpu0_energy_counter_j"] == pytest.approx(100.0 * duration, rel=0.05)
    assert s["mem_used_max_mib"] == 1024.0 and s["gpu1_util_max_pct"] == 60.0
    assert "power_mean_w" not in s and "energy_j" not in s  # GPU 1's power is unknown
    assert any("cannot read power_w" in w for w in sampler.warnings)


def test_nvml_sampler_rejects_missing_gpu_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(time.time()))
    with pytest.raises(ConfigError, match=r"GPU indices \[5\]"):
        NvmlSampler(interval_s=0.1, indices=[0, 5]).start()


# ---------------------------------------------------------------- facade


def test_telemetry_facade_end_to_end(metrics_server: tuple[str, Any], tmp_path: Path) -> None:
    url, _ = metrics_server
    # 0.15 core: a busy loop gets more even on a loaded 2-core machine; the idle server far less
    config = TelemetryConfig(interval_s=0.2, metrics_interval_s=0.5, client_saturation_cpu=0.15)
    server, client = _python(IDLE), _python(BUSY)
    with Telemetry(config, url, "key", server_pid=server.pid, gpu_indices=None) as tel:
        tel.watch_client(client.pid)
        client.wait(timeout=20)
        server.wait(timeout=20)
    summary = tel.stop()  # again: idempotent, summarises what was sampled
    assert summary.client_saturated is True
    assert any("saturated" in w for w in summary.warnings)
    assert summary.process["server_cpu_mean_cores"] < 0.2
    assert summary.metrics["kv_cache_usage_max"] == 0.4375 and summary.metrics["scrapes"] >= 2
    assert summary.gpu == {}  # no GPU here
    assert (
        TelemetrySummary.from_dict(json.loads(json.dumps(summary.to_dict(), allow_nan=False)))
        == summary
    )
    path = tel.write_csv(tmp_path / "telemetry.csv")
    frame = pd.read_csv(path)
    assert list(frame.columns) == CSV_COLUMNS
    assert {"process", "metrics"} <= set(frame["source"])
    assert {"server", "client"} <= set(frame.loc[frame["source"] == "process", "entity"])
    assert frame["t"].is_monotonic_increasing


def test_client_means_over_the_servers_own_and_the_lag_warning() -> None:
    from tuner.telemetry.metrics import client_lag_warning, over_server

    server = {"server_tpot_mean_s": 0.020, "server_e2e_mean_s": 1.5, "server_ttft_mean_s": 0.0}
    ratios = over_server({"ttft": 0.2, "tpot": 0.025, "e2e": 1.53, "itl": None}, server)
    # TTFT: the server saw none (a 0 mean is no observation); ITL: the client has none.
    assert ratios == pytest.approx({"tpot": 1.25, "e2e": 1.02})
    warning = client_lag_warning(ratios, 1.10)
    assert warning is not None and "mean TPOT 1.25x vLLM's own" in warning
    healthy = {"ttft": 1.24, "tpot": 0.996, "e2e": 1.05}  # TTFT's offset is the HTTP work
    assert client_lag_warning(healthy, 1.10) is None
    assert client_lag_warning({"tpot": 1.099, "e2e": 1.099}, 1.10) is None
    # Starved: the tokens piled up and were read together (a real trial on a Zen 5 VM).
    burst = client_lag_warning({"e2e": 3.4816, "tpot": 0.7097, "ttft": 18.1585}, 1.10)
    assert burst is not None and "TPOT 0.71x and E2E 3.48x" in burst
    assert "placement.client_cpus" in burst  # says what to do about it
    assert client_lag_warning({"tpot": 1.0, "e2e": 1.10}, 1.10) is not None
    assert client_lag_warning({"tpot": 0.909}, 1.10) is not None  # just under 1 / 1.10
    assert client_lag_warning({}, 1.10) is None  # no /metrics: nothing to compare


def test_hit_rate_is_the_share_of_queried_prefix_tokens_hit_between_two_scrapes() -> None:
    from tuner.telemetry.metrics import COUNTERS, counter_deltas

    hits, queries = COUNTERS["prefix_cache_hits"], COUNTERS["prefix_cache_queries"]
    before = {hits: 100.0, queries: 1000.0}
    after = counter_deltas(before, {hits: 130.0, queries: 1100.0})
    assert after["prefix_cache_hit_rate"] == pytest.approx(0.3)
    assert "prefix_cache_hit_rate" not in counter_deltas(before, dict(before))  # nothing queried


def test_speculative_decoding_acceptance_over_the_window() -> None:
    """vLLM's spec-decode counters, as its exposition writes them (labels per engine), read as
    the share of proposed tokens accepted and the mean acceptance length (1 + accepted per
    draft); nothing where no draft was proposed."""
    from tuner.telemetry.metrics import counter_deltas, parse_metrics

    def exposition(drafts: int, proposed: int, accepted: int) -> str:
        labels = '{engine="0",model_name="m"}'
        return "".join(
            f"# HELP vllm:{name} x\n# TYPE vllm:{name} counter\nvllm:{name}_total{labels} {v}\n"
            for name, v in (
                ("spec_decode_num_drafts", drafts),
                ("spec_decode_num_draft_tokens", proposed),
                ("spec_decode_num_accepted_tokens", accepted),
            )
        )

    before, after = parse_metrics(exposition(10, 30, 12)), parse_metrics(exposition(110, 330, 132))
    rates = counter_deltas(before, after)
    assert rates["spec_decode_acceptance_rate"] == pytest.approx(120 / 300)
    assert rates["spec_decode_mean_acceptance_length"] == pytest.approx(1 + 120 / 100)
    assert "spec_decode_acceptance_rate" not in counter_deltas(before, before)
