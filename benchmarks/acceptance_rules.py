"""A setting of tuner's acceptance rule against its alternative, side by side, from the
replays' own files.

Each ``replay.json`` under ``benchmarks/results/acceptance/replay/<setting>/<table>_<budget>/``
was written by ``benchmarks.replay`` with both values of one setting, which replays each
strategy under both on the same seeds; this puts each strategy's two runs side by side →
``<setting>/summary.md``:

- ``noise_rule`` (``replay --noise pooled pair``): study.noise, pooled | pair; with each
  measured table's pooled noise in its two throughput columns;
- ``search_window`` (``replay --search-window count drop``): study.count_search_window,
  true | false.

    .venv/bin/python -m benchmarks.acceptance_rules noise_rule search_window
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.layout import DATA, results
from benchmarks.scoring import markdown
from tuner import NoiseEstimate

REPLAYS = results("acceptance", "replay")
TABLES = ("grid_vllm_cpu", "grid_vllm_cpu_avx512", "grid_vllm_cpu_amx", "grid_vllm_cpu_fine")
PARAMS = ("max_num_seqs", "max_num_batched_tokens", "enforce_eager", "kv_cache_dtype")
THROUGHPUT = ("output_tok_s", "output_token_rate")
COLUMNS = (
    "reached_97",
    "final_feasible",
    "median_final_score",
    "switched_worse",
    "median_launches",
)


@dataclass(frozen=True)
class Setting:
    """One setting of the acceptance rule: how replay.py names its alternative's strategies."""

    suffix: str  # <strategy><suffix>: the alternative's runs
    labels: tuple[str, str]  # the default's and the alternative's, as each cell shows them
    flag: str  # the config key


SETTINGS = {
    "noise_rule": Setting("_pair", ("pooled", "pair"), "study.noise"),
    "search_window": Setting("_drop", ("count", "drop"), "study.count_search_window true | false"),
}


def pairs(result: dict[str, Any], where: str, setting: Setting) -> list[dict[str, Any]]:
    """One row per strategy replayed under both values: default | alternative per column."""
    by_name = {line["strategy"]: line for line in result["summary"]}
    rows = []
    for name, base in by_name.items():
        other = by_name.get(f"{name}{setting.suffix}")
        if other is None:
            continue
        runs = [
            {r["seed"]: r for r in result["runs"] if r["strategy"] == s}
            for s in (name, f"{name}{setting.suffix}")
        ]
        worse = [sum(r["worse_switches"] for r in rs.values()) for rs in runs]
        differ = sum(
            r["final_config"] != runs[1][seed]["final_config"] for seed, r in runs[0].items()
        )
        row: dict[str, Any] = {"replay": where, "strategy": name, "seeds_differing": differ}
        for col in COLUMNS:
            row[col] = f"{base[col]} \\| {other[col]}"
        row["worse_switches"] = f"{worse[0]} \\| {worse[1]}"
        row["mean_final_score"] = " \\| ".join(f"{mean_score(rs):.3f}" for rs in runs)
        rows.append(row)
    return rows


def mean_score(runs: dict[int, dict[str, Any]]) -> float:
    """The mean over seeds of the true score of what each run handed over."""
    return float(np.mean([r["final_score"] for r in runs.values()]))


def column_noise() -> list[dict[str, Any]]:
    """Each table's pooled noise (:class:`tuner.NoiseEstimate`, as a study would pool it) in each
    throughput column: how steady each would be as the selection objective."""
    rows = []
    for name in TABLES:
        data = pd.read_csv(DATA / f"{name}.csv")
        data = data[data["status"] == "ok"]
        keys = [p for p in PARAMS if p in data]
        row: dict[str, Any] = {"table": name}
        for col in THROUGHPUT:
            groups = data.dropna(subset=[col]).groupby(keys, dropna=False)[col]
            est = NoiseEstimate.of(*(list(g) for _, g in groups))
            row[f"{col} log SD"], row[f"{col} df"] = round(est.rel_sd, 3), est.df
        rows.append(row)
    return rows


def summarize(name: str) -> str:
    """The setting's table from every replay under its folder (empty if there is none)."""
    setting, folder = SETTINGS[name], REPLAYS / name
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*/replay.json")):
        rows += pairs(json.loads(path.read_text()), path.parent.name, setting)
    if not rows:
        return ""
    table = markdown(rows)
    if name == "noise_rule":
        table += "\n\n" + markdown(column_noise())
    head = f"Each cell: {' | '.join(setting.labels)} ({setting.flag}), same seeds.\n\n"
    (folder / "summary.md").write_text(head + table + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("settings", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    args = p.parse_args(argv)
    for name in args.settings:
        table = summarize(name)
        if not table:
            print(f"no replays with both values of {name} under {REPLAYS / name}", file=sys.stderr)
            return 2
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
