"""The host CPU facts a baseline's fingerprint rests on."""

from __future__ import annotations

from pathlib import Path

from tuner.host.cpu import read_cpuinfo
from tuner.study.state.fingerprint import digest, hardware

EPYC_AVX2 = "AMD EPYC 7B13", "fpu sse avx2 fma"
XEON_AMX = "Intel(R) Xeon(R) Processor", "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile"


def _cpuinfo(tmp_path: Path, model: str, flags: str, name: str = "cpuinfo") -> Path:
    block = f"processor\t: {{n}}\nvendor_id\t: X\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
    path = tmp_path / name
    path.write_text(block.format(n=0) + block.format(n=1))
    return path


def test_read_cpuinfo_model_flags_and_kernel_isa(tmp_path: Path) -> None:
    cpu = read_cpuinfo(_cpuinfo(tmp_path, *XEON_AMX))
    assert cpu.model == "Intel(R) Xeon(R) Processor"
    assert "amx_bf16" in cpu.flags
    assert cpu.isa == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]
    assert read_cpuinfo(_cpuinfo(tmp_path, *EPYC_AVX2)).isa == ["avx2"]


def test_unreadable_cpuinfo_is_empty_not_an_error(tmp_path: Path) -> None:
    cpu = read_cpuinfo(tmp_path / "missing")
    assert (cpu.model, cpu.isa) == ("", [])


def test_this_hosts_cpuinfo_names_its_cpu() -> None:
    cpu = read_cpuinfo()
    assert cpu.model and cpu.flags  # Linux: the tests and vLLM-CPU run on nothing else


def test_cpu_baselines_of_different_cpus_do_not_share_a_fingerprint(tmp_path: Path) -> None:
    # platform.processor() is "" on Linux: before, every 2-core x86 host read "x86_64".
    epyc = hardware("cpu", [], _cpuinfo(tmp_path, *EPYC_AVX2, name="a"))
    xeon = hardware("cpu", [], _cpuinfo(tmp_path, *XEON_AMX, name="b"))
    masked = hardware("cpu", [], _cpuinfo(tmp_path, XEON_AMX[0], "fpu avx2", name="c"))
    again = hardware("cpu", [], _cpuinfo(tmp_path, *XEON_AMX, name="d"))
    assert len({digest(h) for h in (epyc, xeon, masked)}) == 3
    assert digest(xeon) == digest(again)
    assert xeon["cpu"] == "Intel(R) Xeon(R) Processor"


def test_gpu_hardware_is_the_gpu_names() -> None:
    assert hardware("cuda", [{"name": "NVIDIA H200"}]) == {
        "device": "cuda",
        "gpus": ["NVIDIA H200"],
    }
