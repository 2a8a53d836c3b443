"""The A/B's table: each run's speeds against the fastest plain decoding and against float32 `generate`.

    python docs/measurements/2026-11-29-xeon-amx-ab/table.py docs/measurements/2026-11-29-xeon-amx-ab
"""

import json
import sys
from pathlib import Path

folder = Path(sys.argv[1])
for kind in ("qs", "be"):
    print(f"\n{kind}: run | fastest plain | strict (vs fastest, vs generate, tau, tree) | mars@0.9 | mars@0.8")
    means: dict[str, list[list[float]]] = {}
    for tag in ("old1", "new1", "new2", "old2"):
        path = folder / f"{kind}_{tag}.json"
        if not path.exists():
            continue
        methods = json.loads(path.read_text())["methods"]
        plain = {m: v["tokens_per_s"] for m, v in methods.items() if m in ("generate", "vanilla") or "generate@" in m}
        fastest = max(plain, key=plain.get)
        cells = []
        for m in ("strict", "mars@0.9", "mars@0.8"):
            if m in methods:
                v = methods[m]
                vs_generate = v["tokens_per_s"] / methods["generate"]["tokens_per_s"]
                cells.append(f"{v['tokens_per_s']:.1f} ({v['speedup_vs_fastest']:.2f}x, {vs_generate:.2f}x, "
                             f"tau {v['tau']:.2f}, {v.get('tree') or '?'})")
                means.setdefault(f"{tag[:3]} {m}", []).append([v["speedup_vs_fastest"], vs_generate])
        print(f"{tag} | {fastest} {plain[fastest]:.1f} | " + " | ".join(cells))
    for key, rows in sorted(means.items()):
        print(f"  mean {key}: vs fastest {sum(r[0] for r in rows) / len(rows):.3f}x, "
              f"vs float32 generate {sum(r[1] for r in rows) / len(rows):.3f}x over {len(rows)} runs")
