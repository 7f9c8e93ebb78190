"""fp8 KV cache against the model's own dtype, side by side on one vLLM-CPU machine.

``measure_grid.py --grid precision`` measures every batch limit (max_num_seqs 16, 64, 256 and
vLLM's default, 128) with ``kv_cache_dtype`` auto and fp8, repeats interleaved (each repeat a
full pass in its own shuffled order). The two dtypes of one batch limit in one repeat form a
pair; each metric's ratio fp8 / auto is taken per pair and summarized by its median, so a slow
drift of the shared machine cancels instead of favouring one dtype.

    .venv/bin/python -m benchmarks.measure_grid --grid precision --repeats 3
    .venv/bin/python -m benchmarks.precision  # → results/precision/<machine>/precision.{json,md}
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.layout import results
from benchmarks.measure_grid import GRIDS
from benchmarks.scoring import markdown

# The default table was measured on an AVX-512 EPYC (vLLM-CPU starts fp8 KV only with AVX-512
# or AMX); its analysis goes beside that machine's other results.
DEFAULT_OUT = results("precision", "epyc_avx512_2core", "precision")
# output_token_rate: tokens generated inside the window per second (the request-count
# output_tok_s moves in steps of whole requests and cannot tell close configurations apart);
# kv_cache_tokens: the KV capacity vLLM reported at start-up.
METRICS = [
    "output_token_rate",
    "p50_e2e_s",
    "p99_e2e_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "p50_tpot_s",
    "kv_cache_tokens",
]
BATCH = "max_num_seqs"


def load(path: Path) -> pd.DataFrame:
    """The measured rows; a batch limit left out (vLLM's default) reads ``default``."""
    frame = pd.read_csv(path)
    frame[BATCH] = frame[BATCH].map(lambda v: "default" if pd.isna(v) else str(int(v)))
    return frame


def paired_ratios(ok: pd.DataFrame) -> pd.DataFrame:
    """fp8 / auto of every metric, one row per (batch limit, repeat) with both dtypes ok."""
    wide = ok.pivot_table(index=[BATCH, "repeat"], columns="kv_cache_dtype", values=METRICS)
    ratios = pd.DataFrame({m: wide[(m, "fp8")] / wide[(m, "auto")] for m in METRICS})
    return ratios.dropna().reset_index()


def _batch_order(index: pd.Index) -> pd.Index:
    """16 < 64 < 256, vLLM's default last."""
    return index.map(lambda v: int(v) if v.isdigit() else 1 << 30)


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
        for row in frame.to_dict("records")
    ]


def summarize(frame: pd.DataFrame) -> dict[str, Any]:
    ok = frame[frame["status"] == "ok"]
    ratios = paired_ratios(ok)
    by_batch = ratios.groupby(BATCH)[METRICS].median().sort_index(key=_batch_order)
    by_batch.insert(0, "pairs", ratios.groupby(BATCH).size())
    # Every pair: the median, and the quartiles that show how far one pair can be trusted.
    overall = ratios[METRICS].quantile([0.5, 0.25, 0.75]).assign(pairs=len(ratios))
    overall.insert(0, BATCH, ["all", "all (25 %)", "all (75 %)"])
    means = ok.groupby([BATCH, "kv_cache_dtype"])[METRICS].mean()
    means.insert(0, "repeats", ok.groupby([BATCH, "kv_cache_dtype"]).size())
    failed = frame[frame["status"] != "ok"]
    return {
        "measurements": len(frame),
        "failed": _rows(failed[["config_id", "repeat", "reason", "message"]]),
        "loadavg_1m": [float(frame["loadavg_1m"].min()), float(frame["loadavg_1m"].max())],
        "measured": [str(frame["started_at"].min()), str(frame["started_at"].max())],
        "means": _rows(means.reset_index()),
        "pairs": _rows(ratios),
        "median_ratio_fp8_over_auto": _rows(pd.concat([by_batch.reset_index(), overall])),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=GRIDS["precision"].csv)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes <out>.json and .md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = summarize(load(args.csv))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    text = "\n\n".join(
        f"## {name}\n\n{markdown(result[name])}"
        for name in ("median_ratio_fp8_over_auto", "means", "pairs")
        if result[name]
    )
    args.out.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(json.dumps({k: result[k] for k in ("measurements", "failed", "loadavg_1m", "measured")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
