"""The calibration A/B's table: each run's speeds against the fastest plain decoding, the calibration's prediction
and its error, and the tree each method drew.

    python docs/measurements/2026-11-29-xeon-amx-calibration/table.py docs/measurements/2026-11-29-xeon-amx-calibration
"""

import json
import sys
from pathlib import Path

folder = Path(sys.argv[1])
for kind in ("qs", "be"):
    print(f"\n{kind}: run | fastest plain | method: measured x (predicted x, error), tau, tree")
    means: dict[str, list[tuple[float, float]]] = {}
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
            measured, predicted = v["speedup_vs_fastest"], v["predicted_speedup_vs_fastest"]
            error = predicted / measured - 1
            cells.append(f"{m} {measured:.2f}x ({predicted:.2f}x, {100 * error:+.0f}%), tau {v['tau']:.2f}, "
                         f"{v.get('tree') or '?'}")
            means.setdefault(f"{tag[:3]} {m}", []).append((measured, abs(error)))
        print(f"{tag} | {fastest} {plain[fastest]:.1f} | " + " | ".join(cells))
    for key, rows in sorted(means.items()):
        print(f"  mean {key}: {sum(r[0] for r in rows) / len(rows):.3f}x the fastest plain decoding, "
              f"|prediction error| {100 * sum(r[1] for r in rows) / len(rows):.0f}% over {len(rows)} runs")
