"""`tuner check` end to end against the fake streaming server: real Locust, real measurement.

The evidence's reference windows are measured here with the same code path, then the check
runs against the same server (pass), against a slower one (regression, exit 1), against one
whose slowest tenth of requests take twice as long (P99 doubled: regression, not pass),
with a resolution it cannot reach (unresolved, exit 3), and with the inputs that must be
refused (exit 2, one line). The fake's delays are known, so these verdicts are certain;
tests/e2e/test_deployment_vllm.py does the same with a real vLLM deployment.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY_MODEL
from tests.fakes.check_evidence import evidence
from tuner.cli import main
from tuner.deployment.check.endpoint import Endpoint, measure_window
from tuner.deployment.check.evidence_file import read_reference
from tuner.study.decision.noise import NoiseEstimate
from tuner.testing.sse_server import FakeConfig, FakeServer

pytestmark = pytest.mark.integration
KEY, KEY_ENV = "sk-check-test-4455", "TUNER_TEST_CHECK_KEY"
FAST = FakeConfig(ttft_s=0.05, itl_s=0.01, api_key=KEY, model=str(TINY_MODEL))
SLOW = FakeConfig(ttft_s=0.05, itl_s=0.025, api_key=KEY, model=str(TINY_MODEL))
# Every 10th request twice as slow: 10 % of the requests, so the P99 is one of them.
TAIL = FakeConfig(
    ttft_s=0.05, itl_s=0.01, api_key=KEY, model=str(TINY_MODEL), slow_every=10, slow_factor=2.0
)
EVIDENCE_WINDOWS = 3


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer(FAST) as server:
        yield server


@pytest.fixture(scope="module")
def evidence_path(fake: FakeServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Evidence whose reference is three windows of the fast server, measured as `check` does."""
    folder = tmp_path_factory.mktemp("evidence")
    path = folder / "evidence.json"
    # The smallest change these tests ask about: 20 %, and resolving 50 % is enough here. The
    # slow server is 60 % down in tok/s; the fast one's P99 on a shared 2-core VM has read
    # 7.7 % over two reference windows that agreed within 1 % (a CI run), and a few windows'
    # noise estimate cannot know that.
    resolve = {"p99_e2e_latency": 0.5, "output_throughput": 0.5}
    data = evidence(constraints=["slo_p99_e2e", "error_rate"], min_gain=0.2, resolve=resolve)
    data["workload"].update(concurrency=8, window_s=3.0)
    path.write_text(json.dumps(data))
    ref = read_reference(path)
    endpoint = Endpoint(fake.url, KEY, str(TINY_MODEL))
    windows = [
        measure_window(endpoint, str(TINY_MODEL), ref.workload, ref.slo, folder / str(i))
        for i in range(EVIDENCE_WINDOWS)
    ]
    values = [ref.scoring.values(m) for m in windows]
    samples = {n: [v[n] for v in values] for n in ref.scoring.objectives}
    noise = {n: NoiseEstimate.of(s) for n, s in samples.items()}
    data["check"]["samples"] = samples
    data["check"]["noise"] = {n: {"rel_sd": e.rel_sd, "df": e.df} for n, e in noise.items()}
    path.write_text(json.dumps(data))
    return path


def _check(url: str, evidence: Path, out: Path, *extra: str) -> int:
    args = ["check", "--url", url, "--evidence", str(evidence), "--out", str(out)]
    return main([*args, "--api-key-env", KEY_ENV, "--windows", "2", *extra])


def _leaks(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and KEY in p.read_text(errors="replace")]


def test_an_unchanged_deployment_passes_and_a_slower_one_regresses(
    fake: FakeServer,
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    assert _check(fake.url, evidence_path, tmp_path / "same") == 0
    out = capsys.readouterr().out
    assert "verdict: PASS" in out and KEY not in out
    with FakeServer(SLOW) as slow:
        assert _check(slow.url + "/v1/", evidence_path, tmp_path / "slow") == 1
    out = capsys.readouterr().out
    assert "output_throughput" in out.split("verdict: FAIL:")[1]
    suite = ET.parse(tmp_path / "slow" / "junit.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures") or 0) >= 1
    report: dict[str, Any] = json.loads((tmp_path / "slow" / "check.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["output_throughput"]["verdict"] == "regression"
    assert rows["output_throughput"]["change"] < -0.3  # 2.5x the inter-token delay
    assert not _leaks(tmp_path)


def test_a_doubled_p99_reads_regression_not_pass(
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeServer(TAIL) as tail:
        assert _check(tail.url, evidence_path, tmp_path) == 1
    assert "p99_e2e_latency" in capsys.readouterr().out.split("verdict: FAIL:")[1]
    report: dict[str, Any] = json.loads((tmp_path / "check.json").read_text())
    p99 = {r["name"]: r for r in report["rows"]}["p99_e2e_latency"]
    assert p99["verdict"] == "regression" and p99["change"] > 0.6  # twice, less the jitter
    assert p99["resolution"] is not None


def _with_resolve(evidence_path: Path, folder: Path, resolve: float) -> Path:
    data = json.loads(evidence_path.read_text())
    data["check"]["resolve"] = {n: resolve for n in data["check"]["objectives"]}
    path = folder / "strict.json"
    path.write_text(json.dumps(data))
    return path


def test_a_resolution_out_of_reach_is_unresolved_exit_3_and_spends_nothing_more(
    fake: FakeServer,
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """0.1 % asked of three evidence windows: no budget resolves it on P99, so one window is
    all the check measures."""
    monkeypatch.setenv(KEY_ENV, KEY)
    strict = _with_resolve(evidence_path, tmp_path, 0.001)
    args = ["check", "--url", fake.url, "--evidence", str(strict), "--out", str(tmp_path / "o")]
    assert main([*args, "--api-key-env", KEY_ENV, "--windows", "1", "--max-windows", "3"]) == 3
    out = capsys.readouterr().out
    assert "UNRESOLVED (" in out and "verdict: UNRESOLVED" in out
    report: dict[str, Any] = json.loads((tmp_path / "o" / "check.json").read_text())
    assert report["verdict"] == "unresolved" and report["windows"] == 1
    suite = ET.parse(tmp_path / "o" / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    # the fake's token rate is exact (closed loop, fixed delays): only its P99 can stay unresolved
    skipped = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert "objective p99_e2e_latency" in skipped


def test_the_check_measures_the_windows_its_target_needs(
    fake: FakeServer,
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evidence whose noise is 10 % over one degree of freedom: one check window resolves
    nothing at 50 %, a second one (pooled in) does, and the budget allows it."""
    monkeypatch.setenv(KEY_ENV, KEY)
    data = json.loads(evidence_path.read_text())
    data["check"]["noise"] = {n: {"rel_sd": 0.1, "df": 1} for n in data["check"]["objectives"]}
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps(data))
    args = ["check", "--url", fake.url, "--evidence", str(wide), "--out", str(tmp_path / "o")]
    assert main([*args, "--api-key-env", KEY_ENV, "--windows", "1", "--max-windows", "4"]) == 0
    report: dict[str, Any] = json.loads((tmp_path / "o" / "check.json").read_text())
    assert report["windows"] == 2


def test_an_unreachable_endpoint_is_exit_2_after_a_bounded_wait(
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeServer(FAST) as gone:
        url = gone.url
    started = time.monotonic()
    assert _check(url, evidence_path, tmp_path, "--wait-s", "2") == 2
    err = capsys.readouterr().err
    assert "did not answer within 2 s" in err and err.count("\n") == 1
    assert time.monotonic() - started < 15


def test_a_refused_key_is_exit_2(
    fake: FakeServer,
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-not-the-key-123")
    assert _check(fake.url, evidence_path, tmp_path) == 2
    err = capsys.readouterr().err
    assert "refused the API key" in err and "HTTP 401" in err and "sk-not-the-key" not in err


def test_evidence_of_another_model_is_exit_2(
    fake: FakeServer,
    evidence_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    data = json.loads(evidence_path.read_text())
    data["check"]["model"] = {"model": "/models/llama-3-8b", "config_sha256": ""}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    assert _check(fake.url, other, tmp_path, "--tokenizer", str(TINY_MODEL)) == 2
    err = capsys.readouterr().err
    assert "not /models/llama-3-8b" in err and err.count("\n") == 1
