"""Where the benchmarks read and write.

Inputs (measured grid tables) live in ``benchmarks/data/``. Results go to
``benchmarks/results/<question>/<machine>/[<variant>/]``: one folder per question the README
answers, then one per machine kind the figures were measured on (``replay`` and ``simulation``
for the scripts that start no server), so that a figure, its machine and its file sit together.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner import read_cpuinfo

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
RESULTS = ROOT / "benchmarks" / "results"
# The grid tables are named grid_vllm_cpu[_<id>].csv; the first one, measured on an AVX2-only
# host, has no suffix.
GRID_PREFIX, FIRST_GRID = "grid_vllm_cpu", "avx2"


def results(question: str, *parts: str) -> Path:
    return RESULTS.joinpath(question, *parts)


def machine() -> str:
    """This host's kind as a folder name: CPU line, widest kernel ISA and CPUs, e.g.
    ``epyc_avx512_2core``. It cannot tell two generations of one line apart (a Zen 4 from a
    Zen 5 EPYC), so the README's commands name such a machine with ``--out``."""
    cpu = read_cpuinfo()
    words = cpu.model.lower().replace("(r)", " ").split()
    line = next((w for w in ("epyc", "xeon") if w in words), words[0] if words else "cpu")
    flags = cpu.flags
    isa = next(
        (
            name
            for flag, name in (("amx_tile", "amx"), ("avx512f", "avx512"), ("avx2", "avx2"))
            if flag in flags
        ),
        "x86",
    )
    return f"{line}_{isa}_{len(os.sched_getaffinity(0))}core"


def table_id(csv: Path) -> str:
    """The short name of a grid table, as result folders use it (``avx512`` for
    grid_vllm_cpu_avx512.csv); any other file keeps its stem."""
    if not csv.stem.startswith(GRID_PREFIX):
        return csv.stem
    return csv.stem.removeprefix(GRID_PREFIX).lstrip("_") or FIRST_GRID
