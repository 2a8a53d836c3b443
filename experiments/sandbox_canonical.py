"""HumanEval's canonical solutions through the scoring sandbox at one isolation level, and the sandbox's
cost per sample (a trivial program, median of 30). Prints one JSON line.

    python experiments/sandbox_canonical.py LEVEL [BENCH_DIR] [--limit N]   # LEVEL: root, root-drop, bwrap, userns

BENCH_DIR defaults to the configured benchmark directory (`eval.config.paths.bench_dir`). Run it as the
user whose harness you want to measure (a non-root user needs an interpreter it can read).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from eval.config.paths import bench_dir
from eval.scoring import sandbox, unit_tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("level", help="root, root-drop, bwrap or userns")
    parser.add_argument("bench_dir", nargs="?", help="default: the configured benchmark directory")
    parser.add_argument("--limit", type=int, help="only the first N problems")
    parser.add_argument("--costs", type=int, default=30, help="trivial programs timed for the cost per sample")
    args = parser.parse_args()
    tasks = unit_tests.load_tasks(args.bench_dir or bench_dir())
    tasks = dict(list(tasks.items())[: args.limit]) if args.limit else tasks
    records = [{"question_id": q, "choices": [{"index": 0, "turns": [t["canonical_solution"]]}]}
               for q, t in tasks.items()]
    with sandbox.use_isolation(args.level):
        start = time.monotonic()
        result = unit_tests.score_humaneval(records, tasks=tasks, workers=2)
        wall = time.monotonic() - start
        costs = [sandbox.run_sandboxed("pass").seconds for _ in range(args.costs)]
    print(json.dumps({"uid": os.geteuid(), "level": result["sandbox"], "n": result["n"], "pass@1": result["pass@1"],
                      "failed": [q for q, v in result["per_question"].items() if not v["passed"]],
                      "wall_s": round(wall, 2), "per_sample_ms_median": round(1000 * statistics.median(costs), 1),
                      "per_sample_ms_min": round(1000 * min(costs), 1)}))


if __name__ == "__main__":
    main()
