"""Shared fixtures: the repo root, the tiny model, and a check that nothing is left running."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

# A shell without job control starts background commands (`pytest ... &`, `nohup ... &`) with
# SIGINT ignored, and an ignored signal is inherited by every child: `tuner run` would then not
# see the Ctrl-C the tests send. A handled signal resets to the default in children instead.
signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / "models" / "tiny-llama"
# vLLM's CPU platform turns `--distributed-executor-backend uni` into `mp` unless V1
# multiprocessing is off: a third process imports torch and vLLM again. With it off, the worker
# runs in the engine process: ready in 37 s instead of 52 on this VM, at the same tok/s (568
# against 576, one trial each, side by side). Most of the suite's launches take that layout;
# test_trial_vllm, the fault suite and the quickstart keep vLLM's own.
ONE_ENGINE_PROCESS = "+server.env.VLLM_ENABLE_V1_MULTIPROCESSING=0"


def overrides(base: Sequence[str], *extra: str) -> list[str]:
    """Hydra overrides ``base`` with ``extra`` added; an extra key replaces the base entry."""
    keys = {e.split("=", 1)[0].lstrip("+") for e in extra}
    return [b for b in base if b.split("=", 1)[0].lstrip("+") not in keys] + list(extra)


def leftover_processes(scope: str | None = None) -> list[str]:
    """vLLM servers or Locust runs still alive; with ``scope``, only those whose command line
    or environment (TUNER_TRIAL_DIR) names that folder, so concurrent runs do not interfere."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] == os.getpid():
            continue
        if "vllm.entrypoints" not in cmd and "locustfile.py" not in cmd:
            continue
        if scope is not None and scope not in cmd + " " + _environ(proc):
            continue
        out.append(f"{proc.info['pid']}: {cmd[:160]}")
    return out


def _environ(proc: psutil.Process) -> str:
    try:
        return " ".join(f"{k}={v}" for k, v in proc.environ().items())
    except psutil.Error:
        return ""


@pytest.fixture(autouse=True)
def _own_environment() -> Iterator[None]:
    """Each test starts with the environment the session had: a simulated host's set-up
    (tuner.server.simulated) points the process's NVML at its devices, for the CLI's whole
    run, and a test that composes one in-process must not hand that to the next test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    """Fails the test if it leaves a vLLM or Locust process of its tmp_path behind."""
    yield
    left = leftover_processes(str(tmp_path))
    if left:
        for entry in left:  # do not leak them into the next test either
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
        pytest.fail("processes left running:\n" + "\n".join(left))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} is missing: run scripts/setup.sh first")
    return TINY_MODEL
