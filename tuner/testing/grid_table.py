"""A small synthetic grid table in benchmarks.measure_grid's CSV format: 2 params x 3 values
with known answers, for a table-lookup study (tuner.testing.lookup) to search.

Throughput grows with both params, latency too; two repeats per configuration differ by 1 %,
far less than the gaps between configurations.
"""

from __future__ import annotations

import csv
from pathlib import Path

GROUPS = {"first": ["max_num_seqs"], "second": ["max_num_batched_tokens"]}
PARAMS = [p for ps in GROUPS.values() for p in ps]
SEQS, TOKENS = [4, 16, 64], [512, 2048, 8192]
# An absent flag takes the smallest value: a launch without params is (4, 512).
DEFAULTS = {"max_num_seqs": 4, "max_num_batched_tokens": 512}


def write_table(path: Path) -> Path:
    """The table, written to ``path``: 9 configurations, 2 repeats each."""
    cols = ["max_num_seqs", "max_num_batched_tokens", "status", "reason", "p50_e2e_s"]
    cols += ["p99_e2e_s", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s"]
    cols += ["output_tok_s", "request_per_s", "error_rate", "completed", "failed"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for i, s in enumerate(SEQS):
            for j, b in enumerate(TOKENS):
                for rep, jitter in enumerate((0.995, 1.005)):
                    tok = (1000 + 400 * i + 150 * j) * jitter
                    p99 = (1.0 + i + 0.4 * j) * jitter
                    w.writerow(
                        {
                            "max_num_seqs": s,
                            "max_num_batched_tokens": b,
                            "status": "ok",
                            "reason": "",
                            "p50_e2e_s": p99 / 2,
                            "p99_e2e_s": p99,
                            "p50_ttft_s": 0.1,
                            "p99_ttft_s": 0.2,
                            "p50_tpot_s": 0.01,
                            "p99_tpot_s": 0.02,
                            "output_tok_s": tok,
                            "request_per_s": tok / 64,
                            "error_rate": 0.0,
                            "completed": 100 + rep,
                            "failed": 0,
                        }
                    )
    return path
