"""`tuner workload fit`: from the shipped trace (KS of the written config's draws against the
trace), from two scrapes of a vLLM metrics page (quantiles within bucket resolution), and every
bad input as one line and exit 2."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from tuner.cli import main
from tuner.config.workload import WorkloadConfig
from tuner.loadgen.request_plan import sample_lengths
from tuner.traffic.fit import gaps_cv, ks_distance
from tuner.traffic.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "conf" / "workload" / "traces" / "azure_code_2023_sample.csv"
RECORDED = ROOT / "tests" / "data" / "vllm_metrics.txt"
# vLLM's length buckets: build_1_2_5_buckets(max_model_len=2048)
BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]


def _written(path: Path) -> WorkloadConfig:
    """The fitted file read as Hydra reads a workload: merged into the typed schema."""
    schema = OmegaConf.structured(WorkloadConfig)
    merged = OmegaConf.merge(schema, OmegaConf.load(path))
    workload = OmegaConf.to_object(merged)
    assert isinstance(workload, WorkloadConfig)
    workload.validate()
    return workload


def test_a_fit_of_the_shipped_trace_draws_its_lengths(tmp_path: Path) -> None:
    out = tmp_path / "fitted.yaml"
    assert main(["workload", "fit", "--from-trace", str(SAMPLE), "--out", str(out)]) == 0
    workload = _written(out)
    trace = read_trace(SAMPLE)
    rng = np.random.default_rng(7)
    cls = workload.classes[0]
    prompts = sample_lengths(cls.prompt_tokens, 20_000, rng)
    outputs = sample_lengths(cls.output_tokens, 20_000, rng)
    assert ks_distance(prompts, trace.prompt_tokens) <= 0.05
    assert ks_distance(outputs, trace.output_tokens) <= 0.05
    assert workload.mode == "open"
    assert workload.rate == pytest.approx((len(trace) - 1) / trace.span_s, rel=1e-3)
    assert workload.burstiness == pytest.approx(1 / gaps_cv(trace.arrivals) ** 2, rel=1e-2)
    header = out.read_text().splitlines()[:5]
    assert any(line.startswith("# KS distance of prompt lengths: 0.0") for line in header)
    assert any(line.startswith("# arrival CV: source 12.") for line in header)


def _histogram(name: str, lengths: np.ndarray) -> str:
    lines = [f"# HELP {name} lengths", f"# TYPE {name} histogram"]
    label = 'engine="0",model_name="tiny-llama"'
    for le in BUCKETS:
        lines.append(f'{name}_bucket{{{label},le="{le}.0"}} {int((lengths <= le).sum())}.0')
    lines.append(f'{name}_bucket{{{label},le="+Inf"}} {len(lengths)}.0')
    lines.append(f"{name}_count{{{label}}} {len(lengths)}.0")
    lines.append(f"{name}_sum{{{label}}} {int(lengths.sum())}.0")
    return "\n".join(lines) + "\n"


def _page(prompts: np.ndarray, outputs: np.ndarray) -> str:
    return (
        RECORDED.read_text()
        + _histogram("vllm:request_prompt_tokens", prompts)
        + _histogram("vllm:request_generation_tokens", outputs)
    )


class _Pages:
    """A local HTTP server answering /metrics with each page in turn (the last one again)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages
        self.served = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.pages[min(owner.served, len(owner.pages) - 1)].encode()
                owner.served += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _Pages:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def lengths() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Lengths served before the window, and (capped) lengths of the window itself."""
    trace = read_trace(SAMPLE)
    before_p, before_o = trace.prompt_tokens[:300], trace.output_tokens[:300]
    window_p = np.minimum(trace.prompt_tokens[300:900], 1900)
    window_o = trace.output_tokens[300:900]
    yield before_p, before_o, window_p, window_o


def _bucket_of(value: float) -> tuple[float, float]:
    edges = [1.0, *map(float, BUCKETS)]
    for lo, hi in itertools.pairwise(edges):
        if value <= hi:
            return lo, hi
    return edges[-1], edges[-1]


def test_a_fit_of_two_scrapes_agrees_within_the_buckets(
    tmp_path: Path, lengths: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
) -> None:
    before_p, before_o, window_p, window_o = lengths
    first = _page(before_p, before_o)
    second = _page(np.concatenate([before_p, window_p]), np.concatenate([before_o, window_o]))
    out = tmp_path / "fitted.yaml"
    with _Pages([first, second]) as pages:
        argv = ["workload", "fit", "--from-metrics", pages.url, "--window-s", "0.5"]
        assert main([*argv, "--out", str(out)]) == 0
        assert pages.served == 2
    workload = _written(out)
    assert workload.rate == pytest.approx(len(window_o) / 0.5)
    cls = workload.classes[0]
    for dist, known in ((cls.prompt_tokens, window_p), (cls.output_tokens, window_o)):
        q = np.asarray(dist.quantiles)
        for p in (0.1, 0.25, 0.5, 0.75, 0.9):
            fitted = float(np.interp(p, np.linspace(0, 1, len(q)), q))
            lo, hi = _bucket_of(float(np.quantile(known, p, method="inverted_cdf")))
            assert lo <= fitted <= hi, (p, fitted, lo, hi)
    assert "prefix-cache hit rate" not in out.read_text()  # the counters did not move


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["workload", "fit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tuner: error: ")
    return err


def test_bad_traces_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "f.yaml")]
    assert "does not exist" in _one_error(["--from-trace", str(tmp_path / "no.csv"), *out], capsys)
    odd = tmp_path / "odd.csv"
    odd.write_text("when,in,out\n0,1,2\n")
    assert "columns when, in, out" in _one_error(["--from-trace", str(odd), *out], capsys)
    trace = ["--from-trace", str(SAMPLE), *out]
    assert "holds no requests" in _one_error([*trace, "--start-s", "5000"], capsys)
    assert "rate_scale must be > 0" in _one_error([*trace, "--rate-scale", "0"], capsys)
    long = tmp_path / "long.csv"
    long.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,10\n1,6000,10\n")
    err = _one_error(["--from-trace", str(long), "--max-model-len", "2048", *out], capsys)
    assert "every request" in err and "max_model_len=2048" in err
    assert "--from-trace --from-metrics is required" in _one_error(out, capsys)
    assert not (tmp_path / "f.yaml").exists()


def test_bad_metrics_sources_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "f.yaml"), "--window-s", "0.01"]
    url = f"http://127.0.0.1:{_closed_port()}"
    assert "cannot read the metrics of" in _one_error(["--from-metrics", url, *out], capsys)
    with _Pages([RECORDED.read_text()]) as pages:
        err = _one_error(["--from-metrics", pages.url, *out], capsys)
    assert "has no vllm:request_prompt_tokens or vllm:request_generation_tokens histogram" in err
