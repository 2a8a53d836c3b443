#!/usr/bin/env bash
# Install, then run vanilla vs strict vs MARS on the embedded model pair (CPU, no downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python -m eval.run "$@"
