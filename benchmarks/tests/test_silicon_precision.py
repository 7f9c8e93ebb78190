"""Silicon replay tables are keyed by precision: an FP8 run and an NVFP4 run at the same TP and
concurrency are two servers, and no table point is their mean (benchmarks/silicon.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks import silicon
from tuner.testing.gpu_landscape import GPU_PARAM

COLUMNS = [
    "id",
    "silicon_data_source",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "moe_quant_mode",
    "batch_size",
    "tp_size",
    "pp_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
]
LLAMA = "meta-llama/Llama-3.1-70B"


def run(gemm: str, tp: int, users: int, ttft_ms: float, tpot_ms: float, **extra: str) -> dict:
    row = {
        "id": f"{gemm}_tp{tp}_c{users}",
        "silicon_data_source": "a.csv",
        "backend": "vllm",
        "backend_version": "",
        "model_path": LLAMA,
        "system": "b200_sxm",
        "precision": "fp4" if gemm == "nvfp4" else gemm,
        "mode": "agg",
        "isl": "1024",
        "osl": "1024",
        "gemm_quant_mode": gemm,
        "moe_quant_mode": gemm,
        "batch_size": str(users),
        "tp_size": str(tp),
        "pp_size": "1",
        "silicon_ttft_ms": str(ttft_ms),
        "silicon_tpot_ms": str(tpot_ms),
    }
    return row | extra


def write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def tables(name: str = "t") -> dict[str, silicon.SiliconTable]:
    split = silicon.per_precision(
        name, "Llama-3.1-70B", "b200_sxm", 1024, 1024, "m", {"fp8": "fp8", "nvfp4": "fp8"}
    )
    return {t.precision: t for t in split}


def test_two_precisions_at_one_tp_and_concurrency_stay_two_points(tmp_path: Path) -> None:
    """FP8 reads 16 ms TPOT and NVFP4 12 ms at TP 2 with 64 users: each precision's table
    holds its own, and neither holds the 14 ms that averaging them would make."""
    source = write(
        tmp_path / "sample.csv",
        [
            run("fp8", 2, 64, 300.0, 16.0),
            run("nvfp4", 2, 64, 200.0, 12.0),
            run("fp8", 1, 64, 400.0, 24.0),
            run("nvfp4", 1, 64, 250.0, 18.0),
        ],
    )
    split = tables()
    assert sorted(t.name for t in split.values()) == ["t_fp8", "t_nvfp4"]
    read = {p: silicon.landscape(t, source) for p, t in split.items()}
    tpot = {p: land.true((2, 64)).p99_tpot_s for p, land in read.items()}
    ttft = {p: land.true((2, 64)).p99_ttft_s for p, land in read.items()}
    assert tpot == {"fp8": pytest.approx(0.016), "nvfp4": pytest.approx(0.012)}
    assert ttft == {"fp8": pytest.approx(0.300), "nvfp4": pytest.approx(0.200)}
    assert 0.014 not in [pytest.approx(v) for v in tpot.values()]
    # Each table is one precision's grid, with vLLM's defaults taken from it alone.
    for land in read.values():
        assert land.grid_keys() == [(1, 64), (2, 64)]
        assert land.defaults == {GPU_PARAM: 1, "max_num_seqs": 64}


def test_repeats_of_one_server_are_averaged_and_a_hidden_difference_is_refused(
    tmp_path: Path,
) -> None:
    """The same run shipped in two source files is one server measured twice: averaged. Two
    runs of one precision that differ in the vLLM version are two servers: refused, naming
    the column, rather than averaged into a point no version measured."""
    fp8 = tables()["fp8"]
    repeats = write(
        tmp_path / "repeats.csv",
        [
            run("fp8", 2, 64, 300.0, 16.0),
            run("fp8", 2, 64, 310.0, 17.0, silicon_data_source="b"),
        ],
    )
    assert silicon.landscape(fp8, repeats).true((2, 64)).p99_tpot_s == pytest.approx(0.0165)
    versions = write(
        tmp_path / "versions.csv",
        [
            run("fp8", 2, 64, 300.0, 16.0, backend_version="0.11.0"),
            run("fp8", 2, 64, 310.0, 17.0, backend_version="0.18.0"),
        ],
    )
    with pytest.raises(SystemExit, match=r"TP 2 and 64 users differ in \['backend_version'\]"):
        silicon.landscape(fp8, versions)


def test_a_table_holds_runs_of_its_own_precision_only() -> None:
    fp8 = tables()["fp8"]
    assert fp8.holds("b200_sxm", LLAMA, 1024, 1024, "fp8")
    assert not fp8.holds("b200_sxm", LLAMA, 1024, 1024, "nvfp4")
    assert fp8.holds("b200_sxm", LLAMA, 1024, 1024)  # any precision: the run's setting


def test_the_shipped_b200_tables_are_one_per_precision_with_the_measured_tpot() -> None:
    """The B200 70B runs at TP 2 with 64 users (1k/1k): FP8 and NVFP4 measured different
    TPOTs; each per-precision table reads its own, and no B200 table mixes them."""
    b200 = {n: t for n, t in silicon.TABLES.items() if t.system == "b200_sxm"}
    assert sorted(b200) == [
        "llama70b_b200_1k1k_fp8",
        "llama70b_b200_1k1k_nvfp4",
        "llama70b_b200_8k1k_fp8",
        "llama70b_b200_8k1k_nvfp4",
    ]
    rows = [
        r
        for r in silicon.read_rows()
        if r["system"] == "b200_sxm"
        and r["mode"] == "agg"
        and r["backend"] == "vllm"
        and "Llama-3.1-70B" in r["model_path"]
        and (r["isl"], r["osl"], r["tp_size"], r["batch_size"]) == ("1024", "1024", "2", "64")
    ]
    shipped = {r["gemm_quant_mode"]: float(r["silicon_tpot_ms"]) / 1e3 for r in rows}
    assert sorted(shipped) == ["fp8", "nvfp4"] and shipped["fp8"] != shipped["nvfp4"]
    for precision, tpot in shipped.items():
        land = silicon.landscape(silicon.TABLES[f"llama70b_b200_1k1k_{precision}"])
        assert land.true((2, 64)).p99_tpot_s == pytest.approx(tpot, rel=1e-12)
    for table in silicon.TABLES.values():
        assert len({r["gemm_quant_mode"] for r in silicon.rows_of(table)}) == 1, table.name
