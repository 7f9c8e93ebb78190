#!/usr/bin/env python3
"""Walk a GPU preset end to end against real vLLM on a real GPU node (run there; minutes).

The same test that rehearses every GPU preset on a simulated host in CI
(tests/e2e/test_gpu_rehearsal.py) runs here with ``TUNER_REHEARSAL_REAL=1``: `tuner plan`,
`tuner run` on Ray with the node's own GPUs and two trials at once, `tuner report`, `tuner
export`, `tuner capacity`, and `tuner check` of the exported config started with `vllm serve
--config`. It then prints what it verified. A run on real GPUs is never stamped SIMULATED; the
test asserts that too.

    python scripts/gpu_rehearsal_check.py --model /models/Llama-3.1-8B-Instruct [--preset P]

Exit status: 0 every check passed, 1 a check failed, 2 nothing to check here (no GPU, no vLLM).
A JSON report goes to ``$OUT`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/e2e/test_gpu_rehearsal.py"
VERIFIED = [
    "tuner plan estimates the preset's space on the node's GPU system and exits 0",
    "tuner run on Ray: baseline, stages and decisions, two trials at once on disjoint GPUs",
    "tuner report and export: nothing stamped SIMULATED; the exported config fits the node",
    "tuner capacity: the chosen config's highest rate within the SLOs, and replicas",
    "tuner check: the exported config, started with `vllm serve --config`, meets the SLOs",
    "no vLLM server, load generator or Ray trial is left running",
]


def _gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model folder vLLM can serve")
    ap.add_argument("--preset", default="llama8b_h100", help="conf/study/<preset>.yaml")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where the report goes")
    args = ap.parse_args()
    if _gpus() == 0 or shutil.which("vllm") is None:
        print("nothing to check: this node has no GPU or no `vllm` command", file=sys.stderr)
        return 2
    env = {
        **os.environ,
        "TUNER_REHEARSAL_REAL": "1",
        "TUNER_REHEARSAL_MODEL": str(Path(args.model).resolve()),
        "TUNER_REHEARSAL_PRESET": args.preset,
    }
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", TEST, "-x", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    passed = proc.returncode == 0
    report = {
        "preset": args.preset,
        "model": args.model,
        "gpus": _gpus(),
        "passed": passed,
        "seconds": round(time.monotonic() - started),
        "verified": VERIFIED if passed else [],
        "output_tail": (proc.stdout + proc.stderr)[-6000:],
    }
    out = Path(args.out) / "gpu_rehearsal_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(report["output_tail"] if not passed else "")
    verdict = "verified" if passed else "FAILED; nothing below is verified"
    print(f"{args.preset} on {report['gpus']} real GPU(s), {report['seconds']} s: {verdict}")
    for line in VERIFIED:
        print(f"  {'ok' if passed else '--'} {line}")
    print(f"report: {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
