"""How well `tuner plan` ranks what was measured: its estimates against the vLLM runs that
AIConfigurator ships (``systems/silicon_sample.csv``: NVIDIA's own measurements of TTFT and
TPOT per model, GPU, TP, concurrency and input/output length).

Each measured run becomes the plan's point (TP, concurrency, lengths, weight precision, vLLM's
default token budget for the GPU) and is estimated by tuner's :class:`Estimator`. Per system and
model it reports Spearman's rho of estimated against measured TPOT and TTFT, the ratios, and
for a set of TPOT SLOs whether the plan's best TP (the most output tokens per GPU within the
SLO) is the measured best, and what choosing by the plan costs (the measured tokens per GPU of
its choice over the measured best's).

    .venv/bin/python -m benchmarks.plan_fidelity
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import scoring
from benchmarks.layout import results
from benchmarks.silicon import TABLES
from tuner import Estimator, PlanPoint, estimate_vs_measured

# The measured runs' model -> the model config AIConfigurator ships for its architecture (no
# download): the FP8 8B checkpoint is the 8B architecture with FP8 weights.
MODELS = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "Qwen/Qwen3-32B": "Qwen/Qwen3-32B",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen/Qwen3-235B-A22B-FP8",
    "openai/gpt-oss-120b": "openai/gpt-oss-120b",
}
VERSION = "0.24.0"  # the vLLM data AIConfigurator maintains for these systems
CTX_TOKENS = 8192  # vLLM's default token budget on 80-141 GiB GPUs (its OpenAI server)
TPOT_SLOS_MS = (15.0, 25.0, 40.0, 60.0)


def silicon(path: Path | None) -> pd.DataFrame:
    """The shipped vLLM aggregated-serving runs of the models above."""
    source = path or Path(str(resources.files("aiconfigurator_core") / "systems")) / (
        "silicon_sample.csv"
    )
    d = pd.read_csv(source)
    d = d[(d["backend"] == "vllm") & (d["mode"] == "agg") & d["model_path"].isin(list(MODELS))]
    return d.dropna(subset=["tp_size", "batch_size", "silicon_tpot_ms"]).reset_index(drop=True)


def point(row: pd.Series) -> PlanPoint:
    gemm = row["gemm_quant_mode"]
    return PlanPoint(
        tp=int(row["tp_size"]),
        pp=int(row.get("pp_size") or 1),
        batch=int(row["batch_size"]),
        ctx_tokens=CTX_TOKENS,
        isl=int(row["isl"]),
        osl=int(row["osl"]),
        gemm=str(gemm) if isinstance(gemm, str) else None,
        memory_fraction=0.9,
        expert_parallel=float(row.get("moe_ep_size") or 1) > 1,
    )


def estimate_rows(d: pd.DataFrame) -> pd.DataFrame:
    """The estimate of every run (NaN where the estimator cannot place it)."""
    estimators: dict[tuple[str, str], Estimator] = {}
    rows = []
    for _, row in d.iterrows():
        key = (str(row["system"]), MODELS[str(row["model_path"])])
        if key not in estimators:
            estimators[key] = Estimator(key[0], VERSION, key[1])
        e = estimators[key].estimate(point(row))
        rows.append({"est_ttft_ms": e.ttft_ms, "est_tpot_ms": e.tpot_ms, "fits": e.fits.value})
    return pd.concat([d, pd.DataFrame(rows)], axis=1)


def per_group(d: pd.DataFrame) -> list[dict[str, Any]]:
    """Rank agreement per system and model (and precision)."""
    out = []
    for (system, model, prec), g in d.groupby(
        ["system", "model_path", "gemm_quant_mode"], dropna=False
    ):
        tpot = estimate_vs_measured(list(g["est_tpot_ms"]), list(g["silicon_tpot_ms"]), "tpot")
        ttft = estimate_vs_measured(list(g["est_ttft_ms"]), list(g["silicon_ttft_ms"]), "ttft")
        out.append(
            {
                "system": system,
                "model": model,
                "precision": prec if isinstance(prec, str) else "bf16",
                "runs": len(g),
                "estimated": tpot.n,
                "tpot": tpot.__dict__,
                "ttft": ttft.__dict__,
                "best_tp": best_tp(g),
            }
        )
    return out


def _per_gpu(tpot_ms: float, batch: int, tp: int) -> float:
    """Output tokens per second per GPU at a full batch."""
    return batch / (tpot_ms / 1000) / tp if tpot_ms > 0 else math.nan


def best_tp(g: pd.DataFrame) -> dict[str, Any]:
    """For each lengths pair and TPOT SLO: the plan's best TP against the measured best."""
    cases, same, regrets = 0, 0, []
    if g["est_tpot_ms"].isna().all():  # nothing estimated: no choice to compare
        return {"cases": 0, "same_tp": 0, "median_measured_share_of_best": None}
    for _, lengths in g.groupby(["isl", "osl"]):
        for slo in TPOT_SLOS_MS:
            meas = _pick(lengths, "silicon_tpot_ms", slo)
            est = _pick(lengths, "est_tpot_ms", slo)
            if meas is None:
                continue
            cases += 1
            if est is None:
                regrets.append(0.0)  # the plan found nothing within the SLO: no throughput
                continue
            same += int(est["tp_size"] == meas["tp_size"])
            chosen = est["silicon_tpot_ms"]
            ok = chosen <= slo
            got = _per_gpu(chosen, int(est["batch_size"]), int(est["tp_size"])) if ok else 0.0
            best = _per_gpu(meas["silicon_tpot_ms"], int(meas["batch_size"]), int(meas["tp_size"]))
            regrets.append(got / best)
    return {
        "cases": cases,
        "same_tp": same,
        "median_measured_share_of_best": float(pd.Series(regrets).median()) if regrets else None,
    }


def _pick(d: pd.DataFrame, tpot_col: str, slo: float) -> pd.Series | None:
    """The run with the most output tokens per GPU among those with ``tpot_col`` <= ``slo``."""
    ok = d[d[tpot_col] <= slo]
    if ok.empty:
        return None
    score = [
        _per_gpu(t, int(b), int(tp))
        for t, b, tp in zip(ok[tpot_col], ok["batch_size"], ok["tp_size"], strict=True)
    ]
    return ok.iloc[int(pd.Series(score).idxmax())]


def markdown(groups: list[dict[str, Any]]) -> str:
    lines = [
        "| system | model | prec. | runs | TPOT rho | TPOT meas/est | TTFT rho | TTFT meas/est"
        " | best TP same | share of best |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        t, f, b = g["tpot"], g["ttft"], g["best_tp"]
        lines.append(
            f"| {g['system']} | {g['model']} | {g['precision']} | {g['estimated']}/{g['runs']} "
            f"| {_n(t['spearman'])} | {_n(t['ratio_median'])} | {_n(f['spearman'])} "
            f"| {_n(f['ratio_median'])} | {b['same_tp']}/{b['cases']} "
            f"| {_n(b['median_measured_share_of_best'])} |"
        )
    return "\n".join(lines) + "\n"


def figure(d: pd.DataFrame, path: Path) -> None:
    """Estimated against measured TPOT and TTFT, log-log, one colour per system and model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    shown = d.dropna(subset=["est_tpot_ms"])
    for ax, metric in zip(axes, ("tpot", "ttft"), strict=True):
        for (system, model), g in shown.groupby(["system", "model_path"]):
            ax.scatter(
                g[f"est_{metric}_ms"],
                g[f"silicon_{metric}_ms"],
                s=10,
                label=f"{system} {model.split('/')[-1]}",
            )
        lo = min(shown[f"est_{metric}_ms"].min(), shown[f"silicon_{metric}_ms"].min())
        hi = max(shown[f"est_{metric}_ms"].max(), shown[f"silicon_{metric}_ms"].max())
        ax.plot([lo, hi], [lo, hi], color="0.6", lw=1)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=f"estimated {metric.upper()} (ms)",
            ylabel=f"measured {metric.upper()} (ms)",
        )
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    title = "tuner plan (AIConfigurator 0.12, vLLM 0.24.0 data) vs NVIDIA's measured vLLM runs"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ttft_slopes(d: pd.DataFrame) -> pd.DataFrame:
    """Per group of runs that differ only in concurrency (system, model, precision, TP,
    lengths; 3 batches or more): the slope of log(measured TTFT / estimated) over log(batch),
    and whether a silicon replay table searches those runs (``in_table``)."""
    d = d[(d["est_ttft_ms"] > 0) & (d["silicon_ttft_ms"] > 0)]
    keys = ["system", "model_path", "gemm_quant_mode", "tp_size", "isl", "osl"]
    rows = []
    for key, g in d.groupby(keys, dropna=False):
        if g["batch_size"].nunique() < 3:
            continue
        x, y = np.log(g["batch_size"]), np.log(g["silicon_ttft_ms"] / g["est_ttft_ms"])
        row = dict(zip(keys, key, strict=True))
        run = (str(row["system"]), str(row["model_path"]), int(row["isl"]), int(row["osl"]))
        in_table = any(t.holds(*run) for t in TABLES.values())
        rows.append(
            {**row, "runs": len(g), "slope": float(np.polyfit(x, y, 1)[0]), "in_table": in_table}
        )
    return pd.DataFrame(rows)


def _n(value: float | None) -> str:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else f"{value:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=None, help="default: AIConfigurator's own")
    p.add_argument("--out", type=Path, default=results("plan_fidelity", "silicon_sample"))
    args = p.parse_args(argv)
    d = estimate_rows(silicon(args.csv))
    groups = per_group(d)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan_fidelity.json").write_text(json.dumps(groups, indent=1, default=str) + "\n")
    d.to_csv(args.out / "estimates.csv", index=False)
    table = markdown(groups)
    (args.out / "plan_fidelity.md").write_text(table)
    figure(d, args.out / "plan_fidelity.png")
    slopes = ttft_slopes(d)
    rows = slopes.round(2).to_dict("records")
    (args.out / "ttft_slope.md").write_text(scoring.markdown(rows) + "\n")
    held = slopes[~slopes["in_table"]]["slope"]
    print(table)
    print(
        f"TTFT measured/estimated ~ batch**slope over {len(held)} groups no replay table "
        f"searches: median {held.median():.2f}, quartiles {held.quantile(0.25):.2f}-"
        f"{held.quantile(0.75):.2f} (tuner.plan.table.TTFT_SLOPE)"
    )
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
