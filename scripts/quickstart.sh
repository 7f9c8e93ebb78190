#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a real study on the embedded default
# (vLLM's CPU build, the tiny local model, SQLite under studies/quickstart/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tuner run study=quickstart "$@"
