"""Paired in-process A/B of the cycle cuts of 30276a5, on the code that has them: "old" puts back the general
grower at branching 1 (`_draft` then `_rerank`), transformers' repeat_kv in tree forwards (the adapter's `gqa`
off) and the written-out RMSNorm; "new" is the code as it is. Plain decoding (vanilla) is interleaved: per prompt
V O N N O V, the same generator and tree. Outputs are compared token for token. Writes JSON.

    python docs/measurements/2026-11-29-xeon-amx-cycle-cuts/ab_inproc.py OUT.json --trees 6/6/1 8/4/2
    python docs/measurements/2026-11-29-xeon-amx-cycle-cuts/ab_inproc.py OUT.json --model smollm2 --prompts 8 \
        --trees 4/4/1 8/4/2

The prompts are the first of the job's benchmark (`JobPair.prompts`: the stdlib held-out prompts for both models,
in each model's prompt format); float32, torch's own products (the kernels calibration chose on this Xeon).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

import eagle.modules as modules
import eagle.tree as tree
import mars.decoding.drafting as drafting
from eagle.checkpoint import load_draft
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from mars import SpeculativeGenerator, TreeShape

NEW_GROW, NEW_NORM = tree.grow_trees, modules.RMSNorm.forward


def old_grow(head, roots, hidden, logprobs, depth, branching, total_tokens, *, keep_growing=None):
    if depth < 1 or total_tokens < 1:
        return tree.DraftTree.roots_only(roots)
    return tree._rerank(tree._draft(head, hidden, logprobs, depth, branching, keep_growing), roots, total_tokens)


def old_norm(self, x):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    return self.weight * x.to(dtype)


def configure(gen: SpeculativeGenerator, new: bool) -> None:
    drafting.grow_trees = NEW_GROW if new else old_grow
    modules.RMSNorm.forward = NEW_NORM if new else old_norm
    gen.target.gqa = new


def geomean(values: list[float]) -> tuple[float, float]:
    """Geometric mean and the standard error of the mean log."""
    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    se = (sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) ** 0.5 / len(logs) ** 0.5
    return math.exp(mean), se


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--trees", nargs="+", default=["6/6/1", "8/4/2"])
    args = parser.parse_args()
    pair = JobPair.of(f"model={args.model}")
    model = pair.target("float32")
    head = load_draft(str(REPO_ROOT / pair.config.model.draft), model)
    prompts = [torch.tensor([p]) for p in pair.prompts(args.prompts)]
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "model": args.model,
              "prompts": args.prompts, "tokens": args.tokens, "trees": {}}
    for shape in args.trees:
        with SpeculativeGenerator(model, head, TreeShape(*map(int, shape.split("/"))), prepack=False) as gen:
            assert gen.target.gqa, "the GQA route is on for these models"
            gen.generate(prompts[0], max_new_tokens=16)
            gen.vanilla(prompts[0], max_new_tokens=16)
            sums = {k: [0, 0.0] for k in ("vanilla", "old", "new")}
            cycles, ratios, identical = {"old": 0, "new": 0}, [], True
            for ids in prompts:
                seconds, tokens = {}, {}
                for name in ("vanilla", "old", "new", "new", "old", "vanilla"):
                    configure(gen, name == "new")
                    start = time.perf_counter()
                    out = (gen.vanilla(ids, max_new_tokens=args.tokens) if name == "vanilla"
                           else gen.generate(ids, max_new_tokens=args.tokens))
                    elapsed = time.perf_counter() - start
                    sums[name][0] += len(out.tokens)
                    sums[name][1] += elapsed
                    seconds[name] = seconds.get(name, 0.0) + elapsed
                    tokens.setdefault(name, list(out.tokens))
                    cycles[name] = cycles.get(name, 0) + (out.num_cycles if name != "vanilla" else 0)
                identical &= tokens["old"] == tokens["new"] == tokens["vanilla"]
                ratios.append(seconds["old"] / seconds["new"])
            configure(gen, True)
        speed = {k: n / s for k, (n, s) in sums.items()}
        paired, log_se = geomean(ratios)
        report["trees"][shape] = {
            "tokens_per_s": speed, "new_over_old": speed["new"] / speed["old"],
            "new_over_vanilla": speed["new"] / speed["vanilla"], "old_over_vanilla": speed["old"] / speed["vanilla"],
            "per_prompt_geomean_new_over_old": paired, "per_prompt_log_se": log_se,
            "tau": {k: sums[k][0] / cycles[k] for k in ("old", "new")}, "identical_old_new_vanilla": identical}
        print(shape, report["trees"][shape], flush=True)
    with open(args.out, "w") as f:
        f.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
