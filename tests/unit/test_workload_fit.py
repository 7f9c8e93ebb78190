"""`tuner workload fit`: from the shipped trace (KS of the written config's draws against the
trace), class by class (a class column or a rule on prompt length), from two scrapes of a vLLM
metrics page (quantiles within bucket resolution), and every bad input as one line and exit 2."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
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
    # a trace without classes is one class, as it always was
    assert [(c.name, c.weight) for c in workload.classes] == [("fitted", 1.0)]
    assert not any(line.startswith("# class ") for line in out.read_text().splitlines())


def _mixed(path: Path, n: int = 3000, seed: int = 5, column: bool = True) -> pd.DataFrame:
    """A made-up plain trace: 70 % chat (prompts 20-400 tokens, outputs 5-50) and documents
    (prompts 1000-4000, outputs 100-300), Poisson arrivals."""
    rng = np.random.default_rng(seed)
    chat = rng.random(n) < 0.7
    frame = pd.DataFrame(
        {
            "arrival_s": np.cumsum(rng.exponential(0.1, n)),
            "prompt_tokens": np.where(chat, rng.integers(20, 400, n), rng.integers(1000, 4000, n)),
            "output_tokens": np.where(chat, rng.integers(5, 50, n), rng.integers(100, 300, n)),
        }
    )
    if column:
        frame["request_class"] = np.where(chat, "chat", "documents")
    frame.to_csv(path, index=False)
    return frame


def _class_lines(text: str) -> dict[str, str]:
    """The per-class fidelity lines printed, by class."""
    lines = [ln.split("class ", 1)[1] for ln in text.splitlines() if "  class " in ln]
    return {ln.split(":", 1)[0]: ln for ln in lines}


@pytest.mark.parametrize("by", ["column", "rule"])
def test_a_fit_by_class_fits_each_class_on_its_own(
    by: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.csv"
    source = _mixed(path, column=by == "column")
    out = tmp_path / "fitted.yaml"
    rule = ["--class-by-prompt", "chat:512,documents"] if by == "rule" else []
    assert main(["workload", "fit", "--from-trace", str(path), *rule, "--out", str(out)]) == 0
    printed = capsys.readouterr().err
    workload = _written(out)
    chat = source["prompt_tokens"] <= 512
    assert [c.name for c in workload.classes] == ["chat", "documents"]
    assert sum(c.weight for c in workload.classes) == pytest.approx(1.0, abs=1e-5)
    assert workload.classes[0].weight == pytest.approx(chat.mean(), abs=1e-6)
    lines = _class_lines(printed)
    assert set(lines) == {"chat", "documents"}
    rng = np.random.default_rng(11)
    for cls, mask in zip(workload.classes, (chat, ~chat), strict=True):
        rows = source[mask]
        n = len(rows)
        assert f"{cls.name}: {n / len(source):.1%} of requests ({n})" in lines[cls.name]
        # each class's own lengths: its quantiles stay inside its rows' range ...
        q = cls.prompt_tokens.quantiles
        assert min(q) >= rows["prompt_tokens"].min() and max(q) <= rows["prompt_tokens"].max()
        # ... and its draws are close to them, as the printed KS says
        for dist, column in ((cls.prompt_tokens, "prompt"), (cls.output_tokens, "output")):
            drawn = sample_lengths(dist, 20_000, rng)
            assert ks_distance(drawn, rows[f"{column}_tokens"].to_numpy()) <= 0.05
            ks = float(lines[cls.name].split(f"of {column} lengths ")[1].split(",")[0])
            assert ks <= 0.05
    # the totals are printed too, and written at the top with each class's line
    assert "KS distance of prompt lengths (all classes): 0.0" in printed
    header = [ln for ln in out.read_text().splitlines() if ln.startswith("#")]
    assert sum(ln.startswith("# class ") for ln in header) == 2
    span = np.ptp(source["arrival_s"])  # one arrival process for the mix
    assert workload.rate == pytest.approx((len(source) - 1) / span, rel=1e-4)


def test_a_fit_of_the_azure_sample_by_prompt_length_has_its_shares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fitted.yaml"
    argv = ["--from-trace", str(SAMPLE), "--class-by-prompt", "short:1024,long"]
    assert main(["workload", "fit", *argv, "--out", str(out)]) == 0
    workload = _written(out)
    raw = pd.read_csv(SAMPLE)
    short = int((raw["ContextTokens"] <= 1024).sum())
    shares = {"short": short / len(raw), "long": 1 - short / len(raw)}
    assert {c.name: c.weight for c in workload.classes} == pytest.approx(shares, abs=1e-6)
    lines = _class_lines(capsys.readouterr().err)
    assert f"({short})" in lines["short"] and f"({len(raw) - short})" in lines["long"]


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--class-by-prompt", "chat:5x,documents"], "--class-by-prompt 'chat:5x': the bound"),
        (["--class-by-prompt", "chat:512,documents:256"], "max_prompt_tokens=256 does not"),
        (["--class-by-prompt", "chat,documents:512"], "[0] ('chat') has no max_prompt_tokens"),
        (["--class-by-prompt", "chat:512,chat"], "[1].name='chat' is already"),
        (["--class-by-prompt", "chat:0,documents"], "max_prompt_tokens=0 must be >= 1"),
        (["--class-by-prompt", "chat:512,"], "--class-by-prompt[1].name is empty"),
        (["--class-by-prompt", "chat:512", "--class-column", "x"], "both class the trace"),
        (["--class-column", "model"], "--class-column='model' is not a column of trace"),
        (["--class-by-prompt", "a:512,b:1024"], "row 1: a prompt of 4808 tokens is over every"),
    ],
)
def test_bad_class_options_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "f.yaml")]
    assert message in _one_error(["--from-trace", str(SAMPLE), *argv, *out], capsys)
    assert not (tmp_path / "f.yaml").exists()


def test_a_rule_on_a_trace_with_a_class_column_or_on_metrics_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.csv"
    _mixed(path, n=20)
    out = ["--out", str(tmp_path / "f.yaml")]
    rule = ["--class-by-prompt", "chat:512,documents"]
    err = _one_error(["--from-trace", str(path), *rule, *out], capsys)
    assert "--class-by-prompt and the class column 'request_class'" in err and "row" not in err
    err = _one_error(["--from-metrics", "http://127.0.0.1:1", *rule, *out], capsys)
    assert "they need --from-trace" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens,request_class\n0,10,5,chat\n1,9,5,\n")
    assert "row 2: no request_class" in _one_error(["--from-trace", str(bad), *out], capsys)


def test_bad_metrics_sources_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "f.yaml"), "--window-s", "0.01"]
    url = f"http://127.0.0.1:{_closed_port()}"
    assert "cannot read the metrics of" in _one_error(["--from-metrics", url, *out], capsys)
    with _Pages([RECORDED.read_text()]) as pages:
        err = _one_error(["--from-metrics", pages.url, *out], capsys)
    assert "has no vllm:request_prompt_tokens or vllm:request_generation_tokens histogram" in err
