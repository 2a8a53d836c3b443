"""A two-job θ sweep run in parallel against the same sweep run one job at a time: does parallelism
spoil the speed figures? (eval/runner/locks.py: timed answers are exclusive on a machine.)

    python experiments/sweep_contention.py OUT_DIR [--repeats 3] [eval.run overrides...]

Each repeat runs `python -m eval.run -m method.theta=0.8,0.95` with the joblib launcher at n_jobs=2
into OUT_DIR/parallel<i>, then at n_jobs=1 into OUT_DIR/serial<i> (the same configuration as the
issue that found contended figures: 3 prompts x 32 tokens, tree=cpu, float32, OMP_NUM_THREADS=1).
Writes OUT_DIR/contention.json: per repeat and method, tokens/s in parallel and alone, their ratio,
`contended_share` and `speed_contended` from the parallel run's summaries.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ["num_prompts=3", "max_new_tokens=32", "tree=cpu", "model.dtype=float32", "method.theta=0.8,0.95"]


def sweep(out: Path, jobs: int, extra: list[str]) -> dict[str, dict]:
    """Run the sweep; each method's figures from the job summaries (the mars@ jobs carry every method)."""
    args = [sys.executable, "-m", "eval.run", "-m", *SETTINGS, f"out_dir={out}", "hydra/launcher=joblib",
            f"hydra.launcher.n_jobs={jobs}", f"hydra.sweep.dir={out / 'sweep'}", *extra]
    subprocess.run(args, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True,
                   stdout=subprocess.DEVNULL)
    figures: dict[str, dict] = {}
    for path in sorted(out.glob("mars@*/summary.json")):
        for method, fig in json.loads(path.read_text())["methods"].items():
            if Path(fig["run_dir"]).name.startswith(method):  # the same figures in both jobs' summaries
                figures[method] = fig
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args, extra = parser.parse_known_args()
    result = {"settings": SETTINGS + extra, "repeats": []}
    for i in range(args.repeats):
        parallel = sweep(args.out / f"parallel{i}", 2, extra)
        serial = sweep(args.out / f"serial{i}", 1, extra)
        rows = {m: {"parallel_tokens_per_s": round(parallel[m]["tokens_per_s"], 2),
                    "alone_tokens_per_s": round(serial[m]["tokens_per_s"], 2),
                    "ratio": round(parallel[m]["tokens_per_s"] / serial[m]["tokens_per_s"], 3),
                    "contended_share": parallel[m].get("contended_share"),
                    "speed_contended": parallel[m].get("speed_contended")} for m in parallel if m in serial}
        result["repeats"].append(rows)
        print(f"repeat {i}: " + ", ".join(f"{m} {r['parallel_tokens_per_s']:.1f}/{r['alone_tokens_per_s']:.1f} "
                                          f"({r['ratio']:.2f})" for m, r in rows.items()))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "contention.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
