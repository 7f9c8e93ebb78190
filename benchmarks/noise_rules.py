"""§13's table: the pooled noise rule against the pair rule, from the replays' own files.

Reads every ``benchmarks/results/noise/<landscape>_<setting>/replay.json`` (written by
``replay.py --noise pooled pair``, which replays each strategy under both rules on the same
seeds) and puts each strategy's two rules side by side → ``results/noise/summary.md``, with
each measured table's pooled noise in its two throughput columns.

    .venv/bin/python benchmarks/noise_rules.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from benchmarks.scoring import markdown  # noqa: E402
from tuner.noise import NoiseEstimate  # noqa: E402

RESULTS = ROOT / "benchmarks/results/noise"
TABLES = ("grid_vllm_cpu", "grid_vllm_cpu_avx512", "grid_vllm_cpu_amx", "grid_vllm_cpu_fine")
PARAMS = ("max_num_seqs", "max_num_batched_tokens", "enforce_eager", "kv_cache_dtype")
THROUGHPUT = ("output_tok_s", "output_token_rate")
COLUMNS = ("reached_97", "final_feasible", "median_final_score", "switched_worse")


def pairs(result: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """One row per strategy that was replayed under both rules: pooled | pair per column."""
    by_name = {line["strategy"]: line for line in result["summary"]}
    rows = []
    for name, pooled in by_name.items():
        pair = by_name.get(f"{name}_pair")
        if pair is None:
            continue
        runs = {rule: {r["seed"]: r for r in result["runs"] if r["strategy"] == s}
                for rule, s in (("pooled", name), ("pair", f"{name}_pair"))}  # fmt: skip
        worse = {rule: sum(r["worse_switches"] for r in rs.values()) for rule, rs in runs.items()}
        differ = sum(
            r["final_config"] != runs["pair"][seed]["final_config"]
            for seed, r in runs["pooled"].items()
        )
        row: dict[str, Any] = {"replay": where, "strategy": name, "seeds_differing": differ}
        for col in COLUMNS:
            row[col] = f"{pooled[col]} \\| {pair[col]}"
        row["worse_switches"] = f"{worse['pooled']} \\| {worse['pair']}"
        rows.append(row)
    return rows


def column_noise() -> list[dict[str, Any]]:
    """Each table's pooled noise (tuner.noise, as a study would pool it) in each throughput
    column: how steady each would be as the selection objective."""
    rows = []
    for name in TABLES:
        data = pd.read_csv(ROOT / "benchmarks/data" / f"{name}.csv")
        data = data[data["status"] == "ok"]
        keys = [p for p in PARAMS if p in data]
        row: dict[str, Any] = {"table": name}
        for col in THROUGHPUT:
            groups = data.dropna(subset=[col]).groupby(keys, dropna=False)[col]
            est = NoiseEstimate.of(*(list(g) for _, g in groups))
            row[f"{col} log SD"], row[f"{col} df"] = round(est.rel_sd, 3), est.df
        rows.append(row)
    return rows


def main() -> int:
    rows: list[dict[str, Any]] = []
    for path in sorted(RESULTS.glob("*/replay.json")):
        rows += pairs(json.loads(path.read_text()), path.parent.name)
    if not rows:
        print(f"no replays with both rules under {RESULTS}", file=sys.stderr)
        return 2
    table = markdown(rows) + "\n\n" + markdown(column_noise())
    (RESULTS / "summary.md").write_text(
        "Each cell: pooled | pair (study.noise), same seeds.\n\n" + table + "\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
