#!/usr/bin/env bash
# The first run on a GPU (scripts/gpu_check.py --help says what it measures):
#   bash scripts/gpu_check.sh --shape llama31_8b --out results/gpu_check_llama31_8b.json
#   bash scripts/gpu_check.sh --shape qwen3_8b --out results/gpu_check_qwen3_8b.json
#   bash scripts/gpu_check.sh --shape tiny --out /tmp/gpu_check.json      # CPU, tiny shapes
set -euo pipefail
cd "$(dirname "$0")/.."
# the checkout's packages, where mars-spec is not installed (a lent GPU machine runs a bare copy of the tree)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python scripts/gpu_check.py "$@"
