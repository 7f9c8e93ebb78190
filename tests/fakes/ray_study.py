"""What the Ray tests share: a study of the stand-in GPU server (tests/fakes/gpu_server.py)
through the real runner, trial and load generator; Ray's workers given the simulated host's
NVML (tuner.simulation.fake_nvml); and a check that a Ray instance left nothing running.

Run as a module it is a driver: ``python -m tests.fakes.ray_study <overrides>`` runs `tuner
run`'s StudyRunner on the composed config (without the session's vLLM preflight: the stand-in
is no vLLM), so a test can kill a driver mid-study and resume it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import ROOT, TINY_MODEL
from tuner.simulation import fake_nvml
from tuner.telemetry.nvml import NVML_MODULE_ENV

GPUS = 8  # the GPUs NVML sees in Ray's workers: no fewer than a test's Ray instance declares
RAY_PROCESSES = (
    "raylet",
    "gcs_server",
    "ray::",
    "default_worker.py",
    "ray/dashboard",
    "log_monitor.py",
    "monitor.py",
    "runtime_env/agent",
)

# The stand-in server as `vllm serve` on a GPU host: the real vLLM backend starts it, Locust
# loads it, telemetry samples its GPUs (through the simulated NVML of Ray's workers).
STANDIN = [
    "server=vllm_gpu",
    f"server.model={TINY_MODEL}",
    "server.launcher=['{python}',-m,tests.fakes.gpu_server]",
    "server.startup_timeout_s=60",
    "server.stop_grace_s=5",
    "quality.enabled=false",
    "objectives.names=[p99_e2e_latency,output_throughput]",
    "slo.p99_e2e_s=5",
    "workload.concurrency=2",
    "workload.warmup_s=0.5",
    "workload.window_s=2",
    "workload.drain_timeout_s=5",
    "study.executor=ray",
    "study.baseline_measurements=1",
    "study.repeats=0",
]


def worker_env(record: Path, startup_s: float = 1.0) -> dict[str, Any]:
    """Ray's runtime_env for the workers: NVML's GPUs simulated ones (idle: the stand-in
    writes no state into their folder, kept beside the record), the repository on the path
    (the stand-in is a module of its tests), the stand-in's record file and its start-up
    time."""
    return {
        "env_vars": {
            NVML_MODULE_ENV: fake_nvml.__name__,
            fake_nvml.COUNT_ENV: str(GPUS),
            fake_nvml.STATE_ENV: str(record.parent / "gpus"),
            "PYTHONPATH": str(ROOT),
            "TUNER_FAKE_GPU_RECORD": str(record),
            "TUNER_FAKE_STARTUP_S": str(startup_s),
        }
    }


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def server_lines(trial_folder: Path) -> list[dict[str, Any]]:
    """What the stand-in wrote into the trial's server.log (brought back from its node)."""
    log = trial_folder / "server.log"
    prefix = "stand-in server: "
    return [
        json.loads(line[len(prefix) :])
        for line in log.read_text().splitlines()
        if line.startswith(prefix)
    ]


def running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


def trial_processes() -> list[str]:
    """Stand-in servers, Locust runs and guards of remote trials still running."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(k in cmd for k in ("tests.fakes.gpu_server", "tuner/executor/guard.py")) or (
            "locustfile.py" in cmd and "tuner-trial-" in cmd
        ):
            out.append(f"{proc.info['pid']}: {cmd[:160]}")
    return out


def ray_processes(root: psutil.Process) -> list[psutil.Process]:
    """Ray's processes under ``root`` (a test process that started Ray)."""
    found = []
    for proc in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(proc.cmdline())
            if any(k in cmd for k in RAY_PROCESSES) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def wait_gone(procs: list[psutil.Process], timeout_s: float = 30.0) -> list[str]:
    """Wait for ``procs`` to end; what is still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = procs
    while left and time.monotonic() < deadline:
        left = [p for p in left if running([p.pid])]
        time.sleep(0.2)
    return [f"{p.pid}: {' '.join(p.cmdline())[:120]}" for p in left if running([p.pid])]


@contextlib.contextmanager
def no_trial_left(timeout_s: float = 20.0) -> Iterator[None]:
    """Fails if a remote trial's processes outlive the block (a guard has seconds to act)."""
    yield
    deadline = time.monotonic() + timeout_s
    while (left := trial_processes()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, "trial processes left running:\n" + "\n".join(left)


def main(argv: list[str]) -> int:
    import os

    import ray

    from tuner.cli import _quiet_libraries, compose
    from tuner.study.decision.evaluation import Evaluator
    from tuner.study.loop.runner import StudyRunner

    config = compose(argv)
    _quiet_libraries()
    # Joined before the runner does, to give this job's workers the stand-in's environment
    record = Path(os.environ["TUNER_FAKE_GPU_RECORD"])
    ray.init(address=config.ray.address, runtime_env=worker_env(record), log_to_driver=False)

    def say(message: str) -> None:
        print(message, flush=True)

    StudyRunner(config, Evaluator(config), {"driver": "ray_study"}, say).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
