"""`server=external`: `tuner trial` measures an endpoint it does not own, behind the same seam.

The endpoint is the fake streaming server run as a process of its own (tuner/testing/sse_server.py),
so that "never stops or signals what it did not start" is asserted on a real process: it is
alive and serving after every trial. Real Locust drives it. (A real vLLM as the external
endpoint: tests/e2e/test_deployment_vllm.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, TINY_MODEL
from tuner.cli import main
from tuner.host.children import free_port

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
KEY = "sk-external-test-7788"
FAST = [
    "quality.enabled=false",
    "workload.concurrency=4",
    "workload.warmup_s=1",
    "workload.window_s=2",
    "workload.drain_timeout_s=5",
    "server.startup_timeout_s=10",
]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner.testing.sse_server",
            "--port",
            str(port),
            "--ttft",
            "0.05",
            "--itl",
            "0.005",
            "--api-key",
            KEY,
            "--model",
            str(TINY_MODEL),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=1).ok:
                break
        except requests.ConnectionError:
            time.sleep(0.2)
    yield proc, url
    proc.terminate()
    proc.wait(timeout=10)


def _trial(tmp_path: Path, url: str, *extra: str) -> tuple[int, dict[str, object]]:
    rc = main(
        [
            "trial",
            "server=external",
            f"server.url={url}/v1",
            f"studies_dir={tmp_path}",
            "name=ext",
            *FAST,
            *extra,
            "--trial-id",
            "t",
        ]
    )
    path = tmp_path / "ext" / "trials" / "t" / "result.json"
    return rc, json.loads(path.read_text()) if path.exists() else {}


def _alive(proc: subprocess.Popen[bytes], url: str) -> bool:
    return proc.poll() is None and requests.get(url + "/health", timeout=2).ok


def test_a_trial_measures_the_endpoint_and_leaves_it_running(
    endpoint: tuple[subprocess.Popen[bytes], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, url = endpoint
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    rc, result = _trial(tmp_path, url)
    assert rc == 0, result.get("message")
    m = result["measurements"]
    # measured, whatever the rate: this test shares the host (a fake's count in a 2 s window
    # read 20 with a study running beside it); the load generator's own tests judge rates
    assert isinstance(m, dict) and m["completed"] > 0 and m["error_rate"] == 0
    assert result["argv"] == []  # nothing was run
    assert _alive(proc, url)
    assert KEY not in (tmp_path / "ext" / "trials" / "t" / "result.json").read_text()


def test_a_refused_key_is_a_failed_trial_and_the_endpoint_stays_up(
    endpoint: tuple[subprocess.Popen[bytes], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, url = endpoint
    monkeypatch.setenv("VLLM_API_KEY", "sk-wrong-key-000")
    rc, result = _trial(tmp_path, url)
    assert rc == 1 and result["reason"] == "unauthorized"
    assert _alive(proc, url)


def test_another_served_model_names_what_it_serves(
    endpoint: tuple[subprocess.Popen[bytes], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, url = endpoint
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    rc, result = _trial(tmp_path, url, "server.served_model_name=other")
    assert rc == 1 and result["reason"] == "invalid_argument"
    assert str(TINY_MODEL) in str(result["message"]) and _alive(proc, url)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["server.args.max_num_seqs=8"], "cannot apply max_num_seqs"),
        (["server.url=file:///etc/passwd"], "is not an http(s) URL"),
    ],
)
def test_what_an_external_endpoint_cannot_be_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = ["trial", "server=external", "server.url=http://127.0.0.1:9", f"studies_dir={tmp_path}"]
    assert main([*args, *extra, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
