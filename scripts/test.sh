#!/usr/bin/env bash
# Install, lint, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check --no-cache .  # the cache can hide an error that a clean checkout (CI) reports
# One pytest-xdist worker per core (at most 4), each on one torch thread (tests/conftest.py); work stealing
# evens out the long statistical tests. MARS_TEST_WORKERS=0 runs the suite in this one process. The 30 slowest
# tests are listed at the end: where a trim of the suite (15 minutes on 2 cores) starts.
cores=$(python -c 'import os; print(len(os.sched_getaffinity(0)))')
workers=${MARS_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
if [[ "$workers" -gt 1 ]]; then
    python -m pytest -q -n "$workers" --dist worksteal --durations=30 "$@"
else
    python -m pytest -q --durations=30 "$@"
fi
