#!/usr/bin/env bash
# Create .venv (if missing) and install dynaresize with CPU torch pinned to 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
# Pinned first: an unpinned torch may pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
