"""How much of calibration's prediction miss on the embedded benchmark is the prompts' own: strict's speedup over our
vanilla at one tree, per prompt, on the 24 prompts embedded calibration times (the search's first 16, the last 8
held out for the winner's prediction) and on the benchmark's 64 held-out prompts, all in one process, the two sets
interleaved prompt by prompt, per prompt vanilla, strict, strict, vanilla. Writes JSON.

    python docs/measurements/2026-11-29-xeon-amx-prediction/prompt_sets.py OUT.json [--tree 6/6/1] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from eagle.checkpoint import load_draft
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from eval.runner.job_settings import calibration_prompts
from mars import SpeculativeGenerator, TreeShape


def summary(rows: list[dict]) -> dict:
    """Total tokens over total seconds for each method, their ratio, and the per-prompt log speedups' spread."""
    vanilla = sum(r["vanilla_tokens"] for r in rows) / sum(r["vanilla_s"] for r in rows)
    strict = sum(r["strict_tokens"] for r in rows) / sum(r["strict_s"] for r in rows)
    logs = [math.log(r["speedup"]) for r in rows]
    mean = sum(logs) / len(logs)
    sd = (sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) ** 0.5
    return {"prompts": len(rows), "vanilla_tokens_per_s": round(vanilla, 1), "strict_tokens_per_s": round(strict, 1),
            "speedup": round(strict / vanilla, 3), "per_prompt_geomean": round(math.exp(mean), 3),
            "log_sd": round(sd, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tree", default="6/6/1")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    pair = JobPair.of("model=embedded")
    model = pair.target("float32")
    head = load_draft(str(REPO_ROOT / pair.config.model.draft), model)
    sets = {"calibration": calibration_prompts(pair.config, pair.fmt),
            "bench": [torch.tensor([p]) for p in pair.prompts(64)]}
    rows = []
    with SpeculativeGenerator(model, head, TreeShape(*map(int, args.tree.split("/"))), prepack=False) as gen:
        gen.generate(sets["bench"][0], max_new_tokens=16)
        gen.vanilla(sets["bench"][0], max_new_tokens=16)
        order = [(name, i) for i in range(max(map(len, sets.values()))) for name in sets if i < len(sets[name])]
        for name, i in order:
            prompt, sums = sets[name][i], {"vanilla": [0, 0.0], "strict": [0, 0.0]}
            for method in ("vanilla", "strict", "strict", "vanilla"):
                out = (gen.vanilla if method == "vanilla" else gen.generate)(prompt, max_new_tokens=args.tokens)
                sums[method][0] += len(out.tokens)
                sums[method][1] += out.seconds
            (vt, vs), (st, ss) = sums["vanilla"], sums["strict"]
            rows.append({"set": name, "index": i, "prompt_tokens": prompt.shape[1], "vanilla_tokens": vt,
                         "vanilla_s": vs, "strict_tokens": st, "strict_s": ss, "speedup": (st / ss) / (vt / vs)})
    calibration = [r for r in rows if r["set"] == "calibration"]
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "tree": args.tree,
              "tokens": args.tokens,
              "calibration_search": summary([r for r in calibration if r["index"] < len(calibration) - 8]),
              "calibration_prediction": summary([r for r in calibration if r["index"] >= len(calibration) - 8]),
              "bench": summary([r for r in rows if r["set"] == "bench"]), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
