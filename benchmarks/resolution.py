"""What one measurement resolves on this machine: identical servers ("twins") measured apart.

With C closed-loop users, no more than C requests ever run, so an eager server with
``max_num_seqs`` ≥ C is the same server for the workload whatever the exact limit (vLLM's
default on a CPU server: 128 sequences, 2048 batched tokens). Rows of a grid table
(``measure_grid.py``, any grid with these columns) fall into twin groups by (eager,
min(max_num_seqs, C), max_num_batched_tokens); each group's spread of mean token rates is
the landscape's resolution, which the spread between one configuration's repeats understates
when the whole machine drifts (a slower repeat moves every configuration measured in it).
Compiled servers are left out: their compiled batch sizes follow max_num_seqs.

    .venv/bin/python -m benchmarks.resolution benchmarks/data/twins_vllm_cpu_zen4.csv
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

CPU_DEFAULTS = {"max_num_seqs": 128, "max_num_batched_tokens": 2048}


def twin_table(path: Path, concurrency: int, metric: str) -> pd.DataFrame:
    """One row per configuration: its twin group, repeats, mean and repeat spread."""
    d = pd.read_csv(path)
    d = d[d["status"] == "ok"]
    if "enforce_eager" in d:
        d = d[d["enforce_eager"].fillna(True).astype(bool)]
    for col, default in CPU_DEFAULTS.items():
        d[col] = d[col].fillna(default).astype(int)
    d["group"] = [
        f"eager, {min(s, concurrency)} running, b{b}"
        for s, b in zip(d["max_num_seqs"], d["max_num_batched_tokens"], strict=True)
    ]
    g = d.groupby(["group", "config_id"])[metric]
    out = pd.DataFrame({"repeats": g.size(), "mean": g.mean(), "lo": g.min(), "hi": g.max()})
    out["repeat_spread"] = out["hi"] / out["lo"] - 1
    return out.reset_index()


def group_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per twin group with ≥ 2 configurations: how far its identical servers measured apart."""
    g = table.groupby("group")
    out = pd.DataFrame(
        {
            "twins": g.size(),
            "twin_spread": g["mean"].max() / g["mean"].min() - 1,
            "median_repeat_spread": g["repeat_spread"].median(),
        }
    )
    return out[out["twins"] >= 2]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", type=Path)
    p.add_argument("--concurrency", type=int, default=64, help="the table's closed-loop users")
    p.add_argument("--metric", default="output_token_rate")
    args = p.parse_args(argv)
    table = twin_table(args.csv, args.concurrency, args.metric)
    summary = group_summary(table)
    pd.set_option("display.width", 120)
    print(table.round(3).to_string(index=False))
    print()
    print(summary.round(3).to_string())
    print(
        f"\nlargest twin spread: {summary['twin_spread'].max():.1%}; "
        f"median repeat spread: {table['repeat_spread'].median():.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
