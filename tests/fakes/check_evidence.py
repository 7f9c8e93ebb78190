"""An evidence.json as `tuner export` writes it (the parts `tuner check` reads), with known
numbers, for tests of `tuner check` (tests/unit/test_check.py, tests/integration/
test_check_endpoint.py). The real one is exported from a real study in
tests/e2e/test_deployment_vllm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import TINY_MODEL


def evidence(model_path: Path = TINY_MODEL, **check: Any) -> dict[str, Any]:
    """An evidence.json as `tuner export` writes it (the parts `check` reads)."""
    block = {
        "model": {"model": str(model_path), "config_sha256": ""},
        "served_model_name": None,
        "objectives": {"p99_e2e_latency": "minimize", "output_throughput": "maximize"},
        "constraints": ["slo_p99_e2e", "slo_p99_ttft", "error_rate"],
        "cost": {"cpu_hour": 0.05, "cpus": 1},
        "cpus": 1.0,
        "device": "cpu",
        "min_gain": 0.03,
        "samples": {"p99_e2e_latency": [1.0, 1.05], "output_throughput": [1000.0, 1010.0]},
        "noise": {
            "p99_e2e_latency": {"rel_sd": 0.1, "df": 4},
            "output_throughput": {"rel_sd": 0.04, "df": 4},
        },
        **check,
    }
    workload = {
        "classes": [
            {
                "name": "short",
                "weight": 1.0,
                "api": "completions",
                "prompt_tokens": {"kind": "fixed", "mean": 64, "std": 0, "low": 1, "high": 1000},
                "output_tokens": {"kind": "fixed", "mean": 16, "std": 0, "low": 1, "high": 1000},
            },
        ],
        "mode": "closed",
        "concurrency": 4,
        "warmup_s": 1.0,
        "window_s": 3.0,
        "drain_timeout_s": 5.0,
        "seed": 0,
    }
    return {
        "study": "demo",
        "choice": "final incumbent (batching trial 4)",
        "slo": {"p99_e2e_s": 2.0, "p99_ttft_s": 0.0, "p99_tpot_s": 0.0, "max_error_rate": 0.01},
        "workload": workload,
        "check": block,
    }
