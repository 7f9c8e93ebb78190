"""The simulated GPU host through the real `tuner trial`: started, probed, loaded by Locust,
scraped and stopped like vLLM; its GPUs busy in the trial's telemetry; refusing to start where
vLLM would, with the failure tuner classifies for vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from tests.conftest import ROOT, leftover_processes
from tuner.composition import compose
from tuner.search.resolved import resolve
from tuner.server import LaunchSpec, make_backend
from tuner.server.backend import REASON_INVALID_ARGUMENT
from tuner.server.vllm import classify_failure, root_cause

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]

BASE = [
    "study=llama8b_h100",
    "server=simulated_gpu",
    "plan.system=h100_sxm",
    "quality.enabled=false",
    "workload.concurrency=8",
    "workload.warmup_s=1",
    "workload.window_s=3",
]


def trial(tmp_path: Path, trial_id: str, *extra: str) -> tuple[int, str, dict]:
    env = {**os.environ, "TUNER_SIM_STATE_DIR": str(tmp_path / "gpus"), "PYTHONUNBUFFERED": "1"}
    args = [*BASE, f"studies_dir={tmp_path}", *extra, "--trial-id", trial_id]
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "trial", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = list(tmp_path.glob(f"*/trials/{trial_id}/result.json"))
    result = json.loads(found[0].read_text()) if found else {}
    return proc.returncode, proc.stdout + proc.stderr, result


def test_a_trial_on_the_simulated_host_streams_and_its_gpus_are_busy(tmp_path: Path) -> None:
    code, out, result = trial(
        tmp_path, "ok", "server.model=meta-llama/Meta-Llama-3.1-8B", "server.cuda_visible_devices=3"
    )
    assert code == 0, out[-3000:]
    assert result["status"] == "ok" and result["server"]["version"].startswith("simulated-h100")
    folder = Path(result["folder"])
    assert (folder / "server.log").read_text().splitlines()[1].startswith("SIMULATED GPU HOST")
    requests = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    done = [r for r in requests if r.get("ok", r.get("status") == "ok")]
    assert done, "no request completed"
    telemetry = pd.read_csv(folder / "telemetry.csv")
    util = telemetry[(telemetry.source == "nvml") & (telemetry.metric == "util_pct")]
    assert set(util.entity.astype(str)) == {"3"}  # the one device it was given, sampled
    assert util.value.max() > 50  # busy while it served
    assert not leftover_processes(str(tmp_path))


def test_a_model_that_does_not_fit_fails_at_start_up_as_out_of_memory(tmp_path: Path) -> None:
    code, out, result = trial(
        tmp_path,
        "oom",
        "server.model=meta-llama/Meta-Llama-3.1-70B",
        "server.cuda_visible_devices=0",
    )
    assert code != 0
    assert result["status"] == "failed" and result["reason"] == "out_of_memory", out[-2000:]
    assert "No available memory for the cache blocks" in result["log_tail"]


def test_more_gpus_than_it_was_given_is_refused(tmp_path: Path) -> None:
    code, out, result = trial(
        tmp_path,
        "tp",
        "server.model=meta-llama/Meta-Llama-3.1-8B",
        "server.cuda_visible_devices=0",
        "server.args.tensor_parallel_size=2",
    )
    assert code != 0 and result["status"] == "failed", out[-2000:]
    assert "exceeds the 1 GPUs this server was given" in result["log_tail"]


def _one_gpu(tmp_path: Path, *overrides: str) -> Any:
    """The 8B on one simulated H100 that starts at once (no modelled start-up slept)."""
    return compose(
        [
            *BASE,
            f"studies_dir={tmp_path}",
            "server.model=meta-llama/Meta-Llama-3.1-8B",
            "server.cuda_visible_devices=0",
            "server.env.TUNER_SIM_STARTUP_SCALE=0",
            *overrides,
        ]
    )


def test_a_noisy_host_says_its_noise_in_its_first_line_and_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started and stopped by the simulated backend as a trial does, without Locust's load."""
    monkeypatch.setenv("TUNER_SIM_STATE_DIR", str(tmp_path / "gpus"))
    config = _one_gpu(tmp_path, "server.env.TUNER_SIM_NOISE_CV=0.2")
    log = tmp_path / "server.log"
    with make_backend(config.server, resolve(LaunchSpec(), config.server), log) as server:
        info = server.wait_ready(time.monotonic() + 120)
    assert str(info.version).startswith("simulated-h100_sxm noise CV 0.2 ("), info.version
    first = log.read_text().splitlines()[1]  # after the command line tuner writes
    assert first.startswith("SIMULATED GPU HOST") and ", noise CV 0.2 (" in first, first
    assert "this launch's serving delays x" in first
    assert not psutil.pid_exists(info.pid), "the host outlived its stop"


def test_a_lever_the_host_does_not_model_is_run_unchanged_and_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime lever the host has no model of (speculative decoding, a performance mode)
    starts and serves at the modelled speed of the other flags, and the host names it: in its
    log and in the version every trial, report and export of the launch carries."""
    monkeypatch.setenv("TUNER_SIM_STATE_DIR", str(tmp_path / "gpus"))
    config = _one_gpu(tmp_path)
    spec = LaunchSpec(args={"performance_mode": "interactivity", "scheduling_policy": "fcfs"})
    launch = resolve(spec, config.server)
    log = tmp_path / "server.log"
    with make_backend(config.server, launch, log) as server:
        info = server.wait_ready(time.monotonic() + 120)
    # fcfs is vLLM's default: nothing to stamp; the performance mode is not modelled
    assert "not modelled: performance_mode=interactivity (" in str(info.version), info.version
    assert "scheduling_policy" not in str(info.version)
    assert "not modelled (served at the modelled speed" in log.read_text()
    baseline = resolve(LaunchSpec(), config.server)
    with make_backend(config.server, baseline, tmp_path / "plain.log") as server:
        plain = server.wait_ready(time.monotonic() + 120)
    assert "not modelled" not in str(plain.version)


CV = "a CV from 0 (no noise) up to, not including, 1"


@pytest.mark.parametrize(
    ("name", "value", "meaning"),
    [
        ("TUNER_SIM_NOISE_CV", "abc", CV),
        ("TUNER_SIM_NOISE_CV", "-0.1", CV),
        ("TUNER_SIM_NOISE_CV", "1", CV),
        ("TUNER_SIM_NOISE_CV", "nan", CV),
        ("TUNER_SIM_TIME_SCALE", "fast", "a factor of 0 or more"),  # its other settings alike
    ],
)
def test_a_bad_setting_stops_the_host_at_start_up_with_one_line(
    name: str, value: str, meaning: str
) -> None:
    env = {**os.environ, name: value, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.simulation", "--model", "meta-llama/Meta-Llama-3.1-8B"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert out.splitlines() == [f"ValueError: {name}={value!r} is not {meaning}"]
    # what tuner makes of the log of a server that exits so: a bad argument, this line its cause
    assert classify_failure(out) == REASON_INVALID_ARGUMENT
    assert root_cause(out) == out.strip()
