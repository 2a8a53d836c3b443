"""Two training runs on the same batches, compared at equal steps: the mean agreement per draft step of each
over windows of logged steps, and their paired difference with a 95% interval over the logged steps of each
window. In a run's first epoch every batch is scored before the head trains on it, so these are held-out figures.

    python experiments/paired_runs.py runs/new_warm runs/new_cold --window 100 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def read_log(run: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows}  # a resumed run may log a step again: the last one counts


def compare(a: dict[int, dict], b: dict[int, dict], window: int) -> list[dict]:
    steps = sorted(set(a) & set(b))
    out = []
    for start in range(0, (max(steps) if steps else 0), window):
        inside = [s for s in steps if start < s <= start + window]
        depths = min(min(a[s]["ttt_depth"], b[s]["ttt_depth"]) for s in inside) if inside else 0
        if not inside:
            continue
        row = {"steps": f"{start + 1}-{start + window}", "logged": len(inside), "per_draft_step": []}
        for j in range(depths):
            diffs = [a[s][f"acc_{j}"] - b[s][f"acc_{j}"] for s in inside]
            mean = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1))
            row["per_draft_step"].append({
                "draft_step": j + 1, "a": sum(a[s][f"acc_{j}"] for s in inside) / len(inside),
                "b": sum(b[s][f"acc_{j}"] for s in inside) / len(inside), "a_minus_b": mean,
                "ci95": 1.96 * sd / math.sqrt(len(diffs))})
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = compare(read_log(args.a), read_log(args.b), args.window)
    for row in rows:
        cells = "  ".join(f"step {d['draft_step']}: {d['a']:.3f} vs {d['b']:.3f} "
                          f"({d['a_minus_b']:+.3f} ± {d['ci95']:.3f})" for d in row["per_draft_step"])
        print(f"{row['steps']:>9}  {cells}")
    if args.out:
        Path(args.out).write_text(json.dumps({"a": str(args.a), "b": str(args.b), "windows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
