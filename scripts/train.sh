#!/usr/bin/env bash
# Set up from nothing and run the main job: `dynaresize train` with the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
dynaresize train "$@"
