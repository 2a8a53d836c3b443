"""Where things are: the repository root (relative paths in configs are read from it, not from the
working directory) and the benchmark data directory ($MARS_BENCH_DIR, default ../shared/data/bench).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR_ENV = "MARS_BENCH_DIR"
DEFAULT_BENCH_DIR = "../shared/data/bench"  # relative to the repository root


def resolve(path: str | Path) -> Path:
    """A path as given if absolute, else relative to the repository root (not the working directory)."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def bench_path(data_dir: str | Path | None = None) -> Path:
    """Where the public sets are looked for: `data_dir`, else $MARS_BENCH_DIR, else ../shared/data/bench
    (which may not exist; `bench_dir` checks)."""
    return resolve(data_dir or os.environ.get(BENCH_DIR_ENV) or DEFAULT_BENCH_DIR)


def bench_dir(data_dir: str | Path | None = None) -> Path:
    """The directory of the public sets (`bench_path`), or a FileNotFoundError saying how to get them."""
    directory = bench_path(data_dir)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"benchmark data directory {directory} does not exist. Point bench.data_dir (or ${BENCH_DIR_ENV}) at a "
            "directory of <set>.jsonl files (eval/benchmarks/ lists the sets). The public originals are the "
            "question files in the data directories of the EAGLE (github.com/SafeAILab/EAGLE) and MARS "
            "(github.com/5SSjw/MARS) releases; the project expects them in ../shared/data/bench next to the "
            "repository."
        )
    return directory
