#!/usr/bin/env bash
# Install mars-spec and its dependencies. Keeps an existing torch (GPU users install their own build);
# otherwise installs the CPU wheel torch==2.13.0 (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch" 2>/dev/null || pip install --quiet "torch==2.13.0"
pip install --quiet -e ".[test]"
