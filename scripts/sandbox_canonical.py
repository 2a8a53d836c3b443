"""HumanEval's canonical solutions through the scoring sandbox at one isolation level, and the sandbox's
cost per sample (a trivial program, median of 30). Prints one JSON line.

    python scripts/sandbox_canonical.py LEVEL [BENCH_DIR]      # LEVEL: root, root-drop, bwrap, userns

BENCH_DIR defaults to the configured benchmark directory (`eval.config.paths.bench_dir`). Run it as the
user whose harness you want to measure (a non-root user needs an interpreter it can read).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from eval.config.paths import bench_dir
from eval.scoring import humaneval, sandbox


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    level = argv[0]
    tasks = humaneval.load_tasks(argv[1] if len(argv) > 1 else bench_dir())
    records = [{"question_id": q, "choices": [{"index": 0, "turns": [t["canonical_solution"]]}]}
               for q, t in tasks.items()]
    with sandbox.use_isolation(level):
        start = time.monotonic()
        result = humaneval.score_humaneval(records, tasks=tasks, workers=2)
        wall = time.monotonic() - start
        costs = [sandbox.run_sandboxed("pass").seconds for _ in range(30)]
    print(json.dumps({"uid": os.geteuid(), "level": result["sandbox"], "n": result["n"], "pass@1": result["pass@1"],
                      "failed": [q for q, v in result["per_question"].items() if not v["passed"]],
                      "wall_s": round(wall, 2), "per_sample_ms_median": round(1000 * statistics.median(costs), 1),
                      "per_sample_ms_min": round(1000 * min(costs), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
