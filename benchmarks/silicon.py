"""Real GPU landscapes: AIConfigurator's shipped vLLM measurements as replay tables.

``aiconfigurator_core/systems/silicon_sample.csv`` (read from the installed package at run time,
never copied here) holds measured vLLM runs: mean TTFT and TPOT per model, GPU, TP, concurrency
and input/output length. One table is one (model, GPU, ISL, OSL): its knobs are
``tensor_parallel_size`` and ``max_num_seqs`` (the measured concurrency). Each configuration is
served the users it was measured with (the fleet's load balancer gives each replica
``max_num_seqs`` users), so benchmarks.queueing adds no wait: P99 TTFT and P99 TPOT are the
measured means (the sample holds no percentiles). vLLM's defaults are the table's smallest TP
(vLLM's 1 where measured) and its largest concurrency (vLLM's cap of 1024 admits every user).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_landscape import GPU_PARAM, GpuLandscape, measured
from benchmarks.landscape import Key, Measured
from benchmarks.queueing import Load, serve

PARAMS = [GPU_PARAM, "max_num_seqs"]


@dataclass(frozen=True)
class SiliconTable:
    """Which measurements make one table (``model`` is a substring of the model path), and
    what the plan's estimator needs to estimate its points: AIConfigurator's shipped model
    config for the architecture and vLLM's ``--quantization`` of the measured checkpoint."""

    name: str
    model: str
    system: str
    isl: int
    osl: int
    estimator_model: str = ""
    quantization: str | None = None

    def holds(self, system: str, model_path: str, isl: int, osl: int) -> bool:
        """Whether a run of ``model_path`` on ``system`` at these lengths is one of this table's."""
        return system == self.system and self.model in model_path and (isl, osl) == (
            self.isl, self.osl)  # fmt: skip


L70 = "Llama-3.1-70B"  # the measured model paths contain this
LLAMA70B, GPTOSS = "meta-llama/Meta-Llama-3.1-70B", "openai/gpt-oss-120b"
QWEN32B = "Qwen/Qwen3-32B"  # measured in bf16
TABLES = {
    t.name: t
    for t in (
        # The 70B runs are FP8 weights (gemm_quant_mode fp8); gpt-oss ships its own MXFP4.
        SiliconTable("llama70b_h200_1k1k", L70, "h200_sxm", 1024, 1024, LLAMA70B, "fp8"),
        SiliconTable("llama70b_h200_8k1k", L70, "h200_sxm", 8192, 1024, LLAMA70B, "fp8"),
        SiliconTable("llama70b_h100_1k1k", L70, "h100_sxm", 1024, 1024, LLAMA70B, "fp8"),
        SiliconTable("gptoss120b_h200_1k1k", "gpt-oss-120b", "h200_sxm", 1024, 1024, GPTOSS),
        # Held out: no rule of the search (the look-ahead tolerance, the TTFT slope) was set
        # on these; they check that what was set on the three above carries over.
        SiliconTable("llama70b_b200_1k1k", L70, "b200_sxm", 1024, 1024, LLAMA70B, "fp8"),
        SiliconTable("llama70b_b200_8k1k", L70, "b200_sxm", 8192, 1024, LLAMA70B, "fp8"),
        SiliconTable("llama70b_h200_1k8k", L70, "h200_sxm", 1024, 8192, LLAMA70B, "fp8"),
        SiliconTable("qwen32b_h100_1k1k", "Qwen3-32B", "h100_sxm", 1024, 1024, QWEN32B),
    )
}


def sample_csv() -> Path:
    """The shipped sample, from the installed package (an ImportError names what is missing)."""
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"


def rows_of(table: SiliconTable, path: Path | None = None) -> list[dict[str, str]]:
    with (path or sample_csv()).open(newline="", encoding="utf-8") as f:
        return [
            r for r in csv.DictReader(f)
            if r["backend"] == "vllm" and r["mode"] == "agg"
            and table.holds(r["system"], r["model_path"], int(r["isl"]), int(r["osl"]))
        ]  # fmt: skip


def landscape(table: SiliconTable, path: Path | None = None) -> GpuLandscape:
    """The table's configurations; repeated measurements of one are averaged."""
    runs: dict[Key, list[tuple[float, float]]] = defaultdict(list)
    for r in rows_of(table, path):
        key = (int(float(r["tp_size"])), int(float(r["batch_size"])))
        runs[key].append((float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3))
    if not runs:
        raise SystemExit(f"no vLLM measurements for {table}")
    truths: dict[Key, Measured] = {}
    for (tp, c), pairs in runs.items():
        ttft = sum(p[0] for p in pairs) / len(pairs)
        tpot = sum(p[1] for p in pairs) / len(pairs)
        truths[(tp, c)] = measured(serve(Load(c, table.isl, table.osl), c, ttft, tpot))
    defaults = {GPU_PARAM: min(k[0] for k in runs), "max_num_seqs": max(k[1] for k in runs)}
    return GpuLandscape(PARAMS, truths, defaults)
