"""A stand-in for vLLM on a GPU host that has no GPU: started by the real vLLM backend (as
``server.launcher``), it takes vLLM's flags, records the devices it was given and serves the
OpenAI streaming API of :mod:`tuner.testing.sse_server`.

What it saw (its ``CUDA_VISIBLE_DEVICES``, its tensor/pipeline sizes, its pid and the wall time
it started and stopped) goes to its log (the trial's server.log) and, one JSON line per start,
to the file named by ``TUNER_FAKE_GPU_RECORD`` when that is set. ``TUNER_FAKE_STARTUP_S``
delays its readiness (a model load). Its token gap depends on its tensor-parallel size (TP 2
the fastest), so that a stage of them has a winner to confirm.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from tuner.testing.sse_server import FakeConfig, FakeServer

RECORD_ENV = "TUNER_FAKE_GPU_RECORD"
ITL_S = 0.005
SPEED_BY_TP = {1: 1.0, 2: 0.6, 4: 0.8, 8: 0.9}  # the token gap, relative to TP 1
STARTUP_ENV = "TUNER_FAKE_STARTUP_S"


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-parallel-size", type=int, default=1)
    args, _ = ap.parse_known_args(argv)  # every other vLLM flag is accepted and ignored
    return args


def record(args: argparse.Namespace, event: str) -> dict[str, Any]:
    entry = {
        "event": event,
        "pid": os.getpid(),
        "t": time.time(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "tp": args.tensor_parallel_size,
        "pp": args.pipeline_parallel_size,
        "trial_dir": os.environ.get("TUNER_TRIAL_DIR"),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    line = json.dumps(entry)
    print(f"stand-in server: {line}", flush=True)
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:  # one write per line: appends stay whole
            fh.write(line + "\n")
    return entry


def main(argv: list[str] | None = None) -> None:
    args = _args(sys.argv[1:] if argv is None else argv)
    record(args, "start")
    time.sleep(float(os.environ.get(STARTUP_ENV, "0")))
    itl = ITL_S * SPEED_BY_TP.get(args.tensor_parallel_size, 1.0)
    config = FakeConfig(ttft_s=0.02, itl_s=itl, api_key=os.environ.get("VLLM_API_KEY"))
    server = FakeServer(config, port=args.port)

    def stop(_signum: int, _frame: object) -> None:
        record(args, "stop")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server._httpd.serve_forever()
    finally:
        server._httpd.server_close()


if __name__ == "__main__":
    main()
