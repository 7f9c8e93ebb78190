"""`tuner plan`: the estimator against AIConfigurator's own API, the search space as points, the
system from NVML, and bad input as one line with exit 2. AIConfigurator runs for real (offline,
its shipped model configs and kernel data); only the GPU that NVML would report is faked."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import TINY_MODEL
from tuner.cli import main
from tuner.composition import compose
from tuner.config import ParamSpec
from tuner.config.plan import PlanConfig
from tuner.errors import ConfigError
from tuner.plan import points as plan_space
from tuner.plan import system as plan_system
from tuner.plan.estimate import Estimator, Fit, PlanPoint, step_prefill

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
LLAMA_8B, LLAMA_70B = "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-70B"
VERSION = "0.24.0"


@pytest.fixture(scope="module")
def h200_8b() -> Estimator:
    return Estimator("h200_sxm", VERSION, LLAMA_8B)


def _aic_direct(system: str, model: str, p: PlanPoint) -> dict[str, float]:
    """The same point through AIConfigurator's API, as its notes call it."""
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import RuntimeConfig
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database_view

    db = get_database_view(system, "vllm", VERSION)
    mc = build_model_config(p.tp, p.pp, 1, p.tp, 1, gemm_quant_mode=p.gemm, kvcache_quant_mode=p.kv)
    runtime = RuntimeConfig(isl=p.isl, osl=p.osl, batch_size=p.batch)
    summary = get_backend("vllm").run_agg(
        get_model(model, mc, "vllm"), db, runtime, ctx_tokens=step_prefill(p)
    )
    return dict(summary.get_result_dict())


@pytest.mark.parametrize(
    ("system", "model", "point"),
    [
        (
            "h200_sxm",
            LLAMA_8B,
            PlanPoint(tp=1, batch=32, isl=1024, osl=256, gemm="bfloat16", kv="bfloat16"),
        ),
        ("h100_sxm", LLAMA_70B, PlanPoint(tp=2, batch=16, isl=2048, osl=128, gemm="fp8")),
        (
            "h200_sxm",
            LLAMA_70B,
            PlanPoint(tp=8, batch=64, isl=512, osl=512, gemm="fp8", kv="fp8", ctx_tokens=256),
        ),
    ],
)
def test_estimates_are_aiconfigurators_own(system: str, model: str, point: PlanPoint) -> None:
    ours = Estimator(system, VERSION, model).estimate(point)
    theirs = _aic_direct(system, model, point)
    assert ours.fits in (Fit.YES, Fit.KV)
    assert ours.ttft_ms == pytest.approx(float(theirs["ttft"]), rel=1e-9)
    assert ours.tpot_ms == pytest.approx(float(theirs["tpot"]), rel=1e-9)
    assert ours.tokens_s_gpu == pytest.approx(float(theirs["tokens/s/gpu"]), rel=1e-9)
    assert ours.requests_s == pytest.approx(float(theirs["seq/s"]), rel=1e-9)


def test_kv_capacity_is_aiconfigurators_and_70b_bf16_needs_two_h200s() -> None:
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    est = Estimator("h200_sxm", VERSION, LLAMA_70B)
    point = PlanPoint(tp=2, batch=64, isl=1024, osl=256, gemm="bfloat16", kv="bfloat16")
    theirs = estimate_kv_cache(
        LLAMA_70B,
        "h200_sxm",
        "vllm",
        VERSION,
        max_num_tokens=point.ctx_tokens,
        max_batch_size=64,
        memory_fraction_kind="of_total",
        memory_fraction_value=0.9,
        tp_size=2,
        gemm_quant_mode="bfloat16",
        kvcache_quant_mode="bfloat16",
    )
    assert est.kv_tokens(point) == theirs["total_kv_size_tokens"]
    one = est.estimate(PlanPoint(tp=1, batch=64, isl=1024, osl=256, gemm="bfloat16"))
    assert one.fits == Fit.NO and not one.starts and "no KV budget" in one.note
    assert math.isnan(one.ttft_ms)
    assert est.estimate(PlanPoint(tp=1, batch=64, isl=1024, osl=256, gemm="fp8")).starts


def test_fit_levels_follow_the_kv_cache(h200_8b: Estimator) -> None:
    small = PlanPoint(tp=1, batch=8, isl=1024, osl=256)
    assert h200_8b.estimate(small).fits == Fit.YES
    # 882,732 KV tokens at 0.9 of an H200 (AIConfigurator 0.12's own figure): 1024 sequences of 1280
    # tokens do not fit at once (vLLM queues), one sequence of 10^6 tokens never does.
    crowded = PlanPoint(tp=1, batch=1024, isl=1024, osl=256)
    assert h200_8b.estimate(crowded).fits == Fit.KV
    long = PlanPoint(tp=1, batch=8, isl=1024, osl=256, max_model_len=1_000_000)
    assert h200_8b.estimate(long).fits == Fit.NO


def test_an_estimator_limit_is_unknown_never_a_screen() -> None:
    """No FP4 units on a Hopper GPU in its data: that says nothing about the candidate."""
    est = Estimator("h200_sxm", VERSION, "openai/gpt-oss-120b")
    got = est.estimate(PlanPoint(tp=4, batch=16, isl=1024, osl=1024, gemm="nvfp4"))
    assert got.fits == Fit.UNKNOWN and got.starts


def test_flags_become_points() -> None:
    # vLLM's defaults, not the quickstart's deployment command (4 sequences a step)
    args = [f"server.model={TINY_MODEL}", "server.from_command=null", "workload.concurrency=8"]
    config = compose(args)
    config.search_space = {
        "q": {
            "quantization": ParamSpec("categorical", choices=["none", "fp8"], omit=["none"]),
            "kv_cache_dtype": ParamSpec("categorical", choices=["auto", "fp8"], omit=["auto"]),
        }
    }
    defaults = plan_space.Defaults(1024, 8192)
    p = plan_space.point_of(config, {"quantization": "none", "kv_cache_dtype": "fp8"}, defaults)
    assert (p.gemm, p.kv) == (None, "fp8")  # none: the checkpoint's own precision
    assert p.batch == 8  # 8 closed-loop users never fill 1024 sequences
    assert p.max_model_len == 2048 and p.ctx_tokens == 8192
    q = plan_space.point_of(config, {"quantization": "fp8"}, defaults)
    assert q.gemm == "fp8" and q.kv is None


def test_grid_covers_small_spaces_and_samples_large_ones() -> None:
    specs = {
        "tensor_parallel_size": ParamSpec("categorical", choices=[1, 2, 4, 8]),
        "max_num_seqs": ParamSpec("int", low=4, high=256, log=True),
        "gpu_memory_utilization": ParamSpec("float", low=0.7, high=0.95),
    }
    points, total = plan_space.grid(specs, 5, 1000, seed=0)
    assert total == len(points) == 4 * 5 * 5
    seqs = sorted({p["max_num_seqs"] for p in points})
    assert seqs == [4, 11, 32, 91, 256]  # geometric on a log range, integers
    assert {p["gpu_memory_utilization"] for p in points} == {0.7, 0.7625, 0.825, 0.8875, 0.95}
    sample, total = plan_space.grid(specs, 5, 30, seed=1)
    assert total == 100 and len(sample) == 30 == len({tuple(p.values()) for p in sample})
    assert sample == plan_space.grid(specs, 5, 30, seed=1)[0]  # seeded


def test_system_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559.0}]
    monkeypatch.setattr(plan_system, "gpu_inventory", lambda: gpus)
    assert plan_system.resolve_system(PlanConfig()) == "h100_sxm"
    assert plan_system.resolve_system(PlanConfig(system="h200_sxm")) == "h200_sxm"
    assert plan_system.system_of_gpu("NVIDIA H100 PCIe") == "h100_pcie"
    assert plan_system.system_of_gpu("NVIDIA A100-SXM4-80GB") == "a100_sxm"
    monkeypatch.setattr(plan_system, "gpu_inventory", lambda: [{"name": "NVIDIA T4"}])
    with pytest.raises(ConfigError, match="no system for the GPU 'NVIDIA T4'"):
        plan_system.resolve_system(PlanConfig())
    monkeypatch.setattr(plan_system, "gpu_inventory", list)
    with pytest.raises(ConfigError, match="no GPU is visible"):
        plan_system.resolve_system(PlanConfig())


# TP {1, 2, 4, 8} x quantization {none, fp8} x KV dtype {auto, fp8} x max_num_seqs {4, 64}
GPU_STUDY = [
    "study=llama70b_8xh200",
    "search_space=[parallelism,quantization,batching_coarse]",
    "search_space.parallelism.tensor_parallel_size.choices=[1,2,4,8]",
    "search_space.parallelism.pipeline_parallel_size.choices=[1]",
    "study.stages=[parallelism,quantization,batching]",
]


@pytest.mark.parametrize("system", ["h100_sxm", "h200_sxm"])
@pytest.mark.parametrize("model", [LLAMA_8B, LLAMA_70B])
def test_plan_prints_its_table_of_the_whole_space(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], system: str, model: str
) -> None:
    started = time.monotonic()
    rc = main(
        [
            "plan",
            *GPU_STUDY,
            f"server.model={model}",
            f"plan.system={system}",
            "--out",
            str(tmp_path),
        ]
    )
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert rc == 0 and elapsed < 30, elapsed
    table = pd.read_csv(tmp_path / "plan.csv")
    assert len(table) == 4 * 2 * 2 * 2  # TP x quantization x KV dtype x max_num_seqs
    assert (tmp_path / "plan.png").stat().st_size > 10_000
    assert f"on {system}" in out and "tok/s/gpu" in out
    bf16_tp1 = table[(table.tensor_parallel_size == 1) & (table.quantization == "none")]
    if model == LLAMA_70B:  # 141 GB of bf16 weights fit on no single GPU here
        assert set(bf16_tp1.fits) == {"no"}
        assert "tensor_parallel_size=1 pipeline_parallel_size=1 quantization=none" in out
    else:
        assert "no" not in set(bf16_tp1.fits)
        assert "does not fit" not in out
    starts = table[table.fits != "no"]
    assert starts.ttft_ms.notna().all() and (starts.usd_per_mtok > 0).all()


def test_plan_sizes_replicas_for_a_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    rc = main(
        [
            "plan",
            *GPU_STUDY,
            f"server.model={LLAMA_8B}",
            "plan.system=h100_sxm",
            "--target-rps",
            "50",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("for 50 req/s"))
    line, cost = lines[at], lines[at + 1]
    assert "30% headroom" in line and "replicas" in line and "/month" in cost
    gpus = int(line.split(" GPUs")[0].rsplit(" ", 1)[-1])  # "... 3 replicas, 6 GPUs at ..."
    assert f"({gpus} x H100 at $" in cost  # the line prices every GPU it counts


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan.system=h300_sxm"], "unknown GPU system 'h300_sxm'"),
        (["plan.system=h200_sxm", "server.model=/tmp"], "has no config.json"),
        (["plan.system=h200_sxm", "server.model=acme/Llama-3.3-70B-Instruct"], "no hub download"),
        (["plan.system=h200_sxm", "--target-rps", "0"], "target rate must be > 0"),
        (["plan.system=h200_sxm", "--target-rps", "-3"], "target rate must be > 0"),
        (["plan.system=h200_sxm", "plan.headroom=1.0"], "headroom must be in [0, 1)"),
        (["plan.system=h200_sxm", "plan.headroom=-0.1"], "headroom must be in [0, 1)"),
    ],
)
def test_bad_plan_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["plan", f"server.model={TINY_MODEL}", *args, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "plan.csv").exists()


def test_the_tiny_local_model_is_read_from_its_config_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["plan", f"server.model={TINY_MODEL}", "plan.system=h200_sxm", "--out", str(tmp_path)]
    )
    assert rc == 0
    assert "tiny-llama on h200_sxm" in capsys.readouterr().out
