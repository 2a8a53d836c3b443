"""Rules at fixed trees on the embedded pair's benchmark prompts, interleaved prompt by prompt in one process: the
speed each tree the calibration may choose gives on the prompts the benchmark asks (the search never sees them).

    python docs/measurements/2026-11-29-xeon-amx-calibration/fixed_trees.py OUT.json --prompts 64 --new-tokens 128 \
        --rules strict --trees 6/6/1 8/8/1 8/4/2 12/4/3
    python docs/measurements/2026-11-29-xeon-amx-calibration/fixed_trees.py OUT.json --prompts 64 --new-tokens 128 \
        --rules strict mars@0.9 --trees 6/6/1 8/8/1   # ../2026-11-29-xeon-amx-ab/mars_trees_theta0.9_64x128.json

float32 with oneDNN, unpacked, no exact attention (the kernels every rule chose on this class); plain decoding at the
same kernels. Each prompt: plain first, then the arms in a rotating order; strict's output is checked against plain
decoding on every prompt. Only ratios within this run mean anything.
"""

import argparse
import json
import time

import torch

from eagle.checkpoint import load_draft
from eagle.config import eos_token_ids
from eval.benchmarks import load_questions
from eval.benchmarks.prompting import encode
from eval.harness import JobPair
from mars import SamplingConfig, SpeculativeGenerator, TreeShape
from mars.rules import make_rule

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--prompts", type=int, default=64)
ap.add_argument("--new-tokens", type=int, default=128)
ap.add_argument("--rules", nargs="+", default=["strict"], help="strict, or mars@THETA")
ap.add_argument("--trees", nargs="+", default=["6/6/1", "8/8/1"], help="N/DEPTH/BRANCHING, top-k drafting")
args = ap.parse_args()

pair = JobPair.of("model=embedded", "bench=embedded")
bench = pair.config.bench
questions = load_questions(bench.questions, bench.data_dir, None, bench.source)[: args.prompts]
model = pair.target("float32")
eos = sorted(eos_token_ids(model, pair.tokenizer))
prompts = [torch.tensor([encode(pair.tokenizer, q, [], pair.fmt)]) for q in questions]
rules = {name: SamplingConfig() if name == "strict" else
         SamplingConfig(rule=make_rule("mars", theta=float(name.split("@")[1]))) for name in args.rules}
chains = [TreeShape(*map(int, label.split("/")), drafting="topk") for label in args.trees]
arms = [(name, sampling, tree) for name, sampling in rules.items() for tree in chains]
gen = SpeculativeGenerator(model, load_draft(pair.config.model.draft, model), chains[0], exact_attention=False,
                           prepack=False)
totals: dict[str, list[float]] = {}  # label: [tokens, seconds, cycles]
with gen:
    gen.vanilla(prompts[0], max_new_tokens=16, eos_token_id=eos)  # warm-up, untimed
    gen.generate(prompts[0], max_new_tokens=16, eos_token_id=eos)
    for i, ids in enumerate(prompts):
        start = time.perf_counter()
        plain = gen.vanilla(ids, max_new_tokens=args.new_tokens, eos_token_id=eos)
        t = totals.setdefault("vanilla", [0, 0.0, 0])
        t[0], t[1] = t[0] + len(plain.tokens) - 1, t[1] + time.perf_counter() - start
        for name, sampling, tree in arms[i % len(arms):] + arms[: i % len(arms)]:
            gen.use_tree(tree)
            start = time.perf_counter()
            out = gen.generate(ids, sampling, max_new_tokens=args.new_tokens, eos_token_id=eos)
            took = time.perf_counter() - start
            if name == "strict":
                assert out.tokens == plain.tokens, f"strict {tree.label} differs from plain decoding"
            t = totals.setdefault(f"{name} {tree.label}", [0, 0.0, 0])
            t[0], t[1], t[2] = t[0] + len(out.tokens) - 1, t[1] + took, t[2] + out.num_cycles
result = {"cpu": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
          "prompts": len(prompts), "new_tokens": args.new_tokens, "results": {}}
plain_speed = totals["vanilla"][0] / totals["vanilla"][1]
for label, (tokens, seconds, cycles) in totals.items():
    result["results"][label] = {"tokens_per_s": tokens / seconds, "vs_vanilla": tokens / seconds / plain_speed,
                                "tau": tokens / cycles if cycles else 1.0}
    print(f"{label:20s} {tokens / seconds:6.1f} tok/s  {tokens / seconds / plain_speed:.3f}x  "
          f"tau {tokens / cycles if cycles else 1.0:.2f}")
with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
