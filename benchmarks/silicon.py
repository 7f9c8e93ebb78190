"""Real GPU landscapes: AIConfigurator's shipped measured vLLM runs as replay tables.

``aiconfigurator_core/systems/silicon_sample.csv`` (read from the installed package at run time,
never copied here) holds measured vLLM runs: mean TTFT and TPOT per model, GPU, precision, TP,
concurrency and input/output length. One table is one (model, GPU, precision, ISL, OSL): its
knobs are ``tensor_parallel_size`` and ``max_num_seqs`` (the measured concurrency). A source
that measured one model in two precisions makes two tables, one per precision, named for it:
an FP8 and an NVFP4 run at the same TP and concurrency are two different servers, and their
mean is a server nobody measured. Each configuration is served the users it was measured with
(the fleet's load balancer gives each replica ``max_num_seqs`` users), so tuner.plan.queueing
adds no wait: P99 TTFT and P99 TPOT are the measured means (the sample holds no percentiles).
vLLM's defaults are the table's smallest TP (vLLM's 1 where measured) and its largest
concurrency (vLLM's cap of 1024 admits every user).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner import Load, serve
from tuner.testing.gpu_landscape import GPU_PARAM, GpuLandscape, measured
from tuner.testing.landscape import Key, Measured

PARAMS = [GPU_PARAM, "max_num_seqs"]
# What a run measured and where it came from; every other column says which server ran, so
# runs that differ in one of them are different configurations, never repeats to average.
MEASURED_COLUMNS = frozenset({"id", "silicon_data_source", "silicon_ttft_ms", "silicon_tpot_ms"})

Row = dict[str, str]


@dataclass(frozen=True)
class SiliconTable:
    """Which measurements make one table (``model`` is a substring of the model path;
    ``precision`` the runs' GEMM quant mode, "" for the checkpoint's own bf16), and what the
    plan's estimator needs to estimate its points: AIConfigurator's shipped model config for the
    architecture and the vLLM ``--quantization`` it estimates them with."""

    name: str
    model: str
    system: str
    isl: int
    osl: int
    precision: str
    estimator_model: str = ""
    quantization: str | None = None

    def holds(
        self, system: str, model_path: str, isl: int, osl: int, precision: str | None = None
    ) -> bool:
        """Whether a run of ``model_path`` on ``system`` at these lengths (and in this
        precision, when given) is one of this table's."""
        same_run = system == self.system and self.model in model_path
        same_precision = precision is None or precision == self.precision
        return same_run and (isl, osl) == (self.isl, self.osl) and same_precision


def per_precision(
    name: str,
    model: str,
    system: str,
    isl: int,
    osl: int,
    estimator_model: str,
    quantization: dict[str, str | None],
) -> list[SiliconTable]:
    """One table per measured precision, each named for it (``<name>_<precision>``);
    ``quantization``: per precision, the vLLM flag its points are estimated with."""
    return [
        SiliconTable(f"{name}_{p}", model, system, isl, osl, p, estimator_model, q)
        for p, q in quantization.items()
    ]


L70 = "Llama-3.1-70B"  # the measured model paths contain this
LLAMA70B, GPTOSS = "meta-llama/Meta-Llama-3.1-70B", "openai/gpt-oss-120b"
QWEN32B = "Qwen/Qwen3-32B"  # measured in bf16
# The B200 runs are FP8 and NVFP4 checkpoints. The plan maps no vLLM flag to NVFP4 weights, so
# an NVFP4 table's points are estimated as FP8, the nearest precision it models (estimated TPOT
# against the NVFP4 runs: Spearman 0.94 as FP8, 0.95 as NVFP4, 0.93 as the checkpoint's bf16).
B200_PRECISIONS: dict[str, str | None] = {"fp8": "fp8", "nvfp4": "fp8"}
TABLES = {
    t.name: t
    for t in (
        # The 70B runs on Hopper are FP8 weights (gemm_quant_mode fp8); gpt-oss ships its own
        # 4-bit weights (the sample calls them nvfp4), which vLLM reads without a flag.
        SiliconTable("llama70b_h200_1k1k", L70, "h200_sxm", 1024, 1024, "fp8", LLAMA70B, "fp8"),
        SiliconTable("llama70b_h200_8k1k", L70, "h200_sxm", 8192, 1024, "fp8", LLAMA70B, "fp8"),
        SiliconTable("llama70b_h100_1k1k", L70, "h100_sxm", 1024, 1024, "fp8", LLAMA70B, "fp8"),
        SiliconTable(
            "gptoss120b_h200_1k1k", "gpt-oss-120b", "h200_sxm", 1024, 1024, "nvfp4", GPTOSS
        ),
        # Held out: no rule of the search (the look-ahead tolerance, the TTFT slope) was set
        # on these; they check that what was set on the three above carries over.
        *per_precision(
            "llama70b_b200_1k1k", L70, "b200_sxm", 1024, 1024, LLAMA70B, B200_PRECISIONS
        ),
        *per_precision(
            "llama70b_b200_8k1k", L70, "b200_sxm", 8192, 1024, LLAMA70B, B200_PRECISIONS
        ),
        SiliconTable("llama70b_h200_1k8k", L70, "h200_sxm", 1024, 8192, "fp8", LLAMA70B, "fp8"),
        SiliconTable("qwen32b_h100_1k1k", "Qwen3-32B", "h100_sxm", 1024, 1024, "", QWEN32B),
    )
}


def sample_csv() -> Path:
    """The shipped sample, from the installed package (an ImportError names what is missing)."""
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"


def read_rows(path: Path | None = None) -> list[Row]:
    with (path or sample_csv()).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def rows_of(table: SiliconTable, path: Path | None = None) -> list[Row]:
    """The table's vLLM aggregated-serving runs, in its precision only."""
    return [r for r in read_rows(path) if _is_vllm_agg(r) and table.holds(*_run(r))]


def _is_vllm_agg(r: Row) -> bool:
    return r["backend"] == "vllm" and r["mode"] == "agg"


def _run(r: Row) -> tuple[str, str, int, int, str]:
    return r["system"], r["model_path"], int(r["isl"]), int(r["osl"]), r["gemm_quant_mode"]


def key_of(r: Row) -> Key:
    return int(float(r["tp_size"])), int(float(r["batch_size"]))


def hidden_variables(runs: Sequence[Row]) -> list[str]:
    """The columns, other than the measurement and its provenance, in which runs differ."""
    columns = sorted({c for r in runs for c in r} - MEASURED_COLUMNS)
    return [c for c in columns if len({r.get(c, "") for r in runs}) > 1]


def landscape(table: SiliconTable, path: Path | None = None) -> GpuLandscape:
    """The table's configurations. Repeated measurements of one server (the same run shipped
    in two source files) are averaged; runs that differ in anything that sets the server
    (precision, versions, parallelism beyond TP) are refused rather than averaged."""
    runs: dict[Key, list[Row]] = defaultdict(list)
    for r in rows_of(table, path):
        runs[key_of(r)].append(r)
    if not runs:
        raise SystemExit(f"no vLLM measurements for {table}")
    truths: dict[Key, Measured] = {}
    for (tp, c), repeats in runs.items():
        differ = hidden_variables(repeats)
        if differ:
            raise SystemExit(
                f"{table.name}: the runs at TP {tp} and {c} users differ in {differ}; "
                "make them part of the table's key (benchmarks/silicon.py) instead of averaging"
            )
        ttft = sum(float(r["silicon_ttft_ms"]) / 1e3 for r in repeats) / len(repeats)
        tpot = sum(float(r["silicon_tpot_ms"]) / 1e3 for r in repeats) / len(repeats)
        truths[(tp, c)] = measured(serve(Load(c, table.isl, table.osl), c, ttft, tpot))
    defaults = {GPU_PARAM: min(k[0] for k in runs), "max_num_seqs": max(k[1] for k in runs)}
    return GpuLandscape(PARAMS, truths, defaults)
