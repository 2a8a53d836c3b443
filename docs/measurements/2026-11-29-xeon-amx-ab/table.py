"""An A/B folder's table (`ab.sh`): each run's speeds against the fastest plain decoding and against float32
`generate`, the calibration's prediction and its error where the run records one, τ and the tree each method drew.

    python docs/measurements/2026-11-29-xeon-amx-ab/table.py docs/measurements/2026-11-29-xeon-amx-ab
    python docs/measurements/2026-11-29-xeon-amx-ab/table.py docs/measurements/2026-11-29-xeon-amx-calibration
"""

import json
import sys
from pathlib import Path

folder = Path(sys.argv[1])
for kind in ("qs", "be"):
    print(f"\n{kind}: run | fastest plain | method: tok/s (vs fastest, vs float32 generate; predicted, error), "
          "tau, tree")
    means: dict[str, list[tuple[float, float, float | None]]] = {}
    for tag in ("old1", "new1", "new2", "old2"):
        path = folder / f"{kind}_{tag}.json"
        if not path.exists():
            continue
        methods = json.loads(path.read_text())["methods"]
        plain = {m: v["tokens_per_s"] for m, v in methods.items() if m in ("generate", "vanilla") or "generate@" in m}
        fastest = max(plain, key=plain.get)
        cells = []
        for m in ("strict", "mars@0.9", "mars@0.8"):
            if m not in methods:
                continue
            v = methods[m]
            measured = v["speedup_vs_fastest"]
            vs_generate = v["tokens_per_s"] / methods["generate"]["tokens_per_s"]
            predicted = v.get("predicted_speedup_vs_fastest")  # absent before the calibration predicted
            error = predicted / measured - 1 if predicted else None
            said = f"; {predicted:.2f}x, {100 * error:+.0f}%" if predicted else ""
            cells.append(f"{m} {v['tokens_per_s']:.1f} ({measured:.2f}x, {vs_generate:.2f}x{said}), "
                         f"tau {v['tau']:.2f}, {v.get('tree') or '?'}")
            means.setdefault(f"{tag[:3]} {m}", []).append((measured, vs_generate, error))
        print(f"{tag} | {fastest} {plain[fastest]:.1f} | " + " | ".join(cells))
    for key, rows in sorted(means.items()):
        errors = [abs(r[2]) for r in rows if r[2] is not None]
        said = f", |prediction error| {100 * sum(errors) / len(errors):.0f}%" if errors else ""
        print(f"  mean {key}: vs fastest {sum(r[0] for r in rows) / len(rows):.3f}x, "
              f"vs float32 generate {sum(r[1] for r in rows) / len(rows):.3f}x over {len(rows)} runs{said}")
