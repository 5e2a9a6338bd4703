#!/usr/bin/env bash
# Set up from nothing and run the whole test suite (what CI runs), vLLM tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-vllm --with-real
. .venv/bin/activate
ruff check src tests bench
python -m pytest -q tests
