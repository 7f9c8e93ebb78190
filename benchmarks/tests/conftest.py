"""The fixtures the benchmarks' tests share: the tiny local model (built by scripts/setup.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.layout import ROOT

TINY_MODEL = ROOT / "models" / "tiny-llama"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} is missing: run scripts/setup.sh first")
    return TINY_MODEL
