#!/usr/bin/env bash
# Install, lint, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
python -m pytest -q "$@"
