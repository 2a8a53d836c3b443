"""Strict greedy at several fixed trees against plain decoding, interleaved question by question, on MT-bench
first turns: is the calibrated 4/4/1 the fastest tree here, or do wider trees, with their higher τ, pay?

    python docs/measurements/2026-11-29-xeon-amx-trees/trees_timed.py OUT.json --questions 8 --new-tokens 256 \
        --trees 4/4/1 8/4/2 16/4/4 32/6/6

Trees at float32 + packed linears (the kernels SmolLM2's calibration chose on this class), plain decoding at
bfloat16 with torch's own products (`bfloat16+aten`, the fastest plain decoding of runs 9-10) and at the trees'
kernels. Each question: plain first, then the trees in a rotating order. Only ratios within this run mean anything.
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
from mars import SpeculativeGenerator, TreeShape

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--questions", type=int, default=8)
ap.add_argument("--new-tokens", type=int, default=256)
ap.add_argument("--trees", nargs="+", default=["4/4/1", "8/4/2", "16/4/4", "32/6/6"])
ap.add_argument("--head", default="data/models/smollm2/draft")
args = ap.parse_args()

pair = JobPair.of("model=smollm2", "bench=mt_bench")
bench = pair.config.bench
questions = load_questions(bench.questions, bench.data_dir, None, bench.source)[: args.questions]  # category order
f32, bf16 = pair.target("float32"), pair.target("bfloat16")
eos = sorted(eos_token_ids(f32, pair.tokenizer))
prompts = [torch.tensor([encode(pair.tokenizer, q, [], pair.fmt)]) for q in questions]
shapes = [TreeShape(*map(int, t.split("/")), drafting="topk") for t in args.trees]
trees = SpeculativeGenerator(f32, load_draft(args.head, f32), shapes[0], exact_attention=False, prepack=True)
plain = SpeculativeGenerator(bf16, load_draft(args.head, bf16), shapes[0], exact_attention=False, prepack=False,
                             onednn=False)
totals: dict[str, list[float]] = {}  # label: [tokens, seconds, cycles]
with trees, plain:
    for ids in prompts[:1]:  # warm-up, untimed
        plain.vanilla(ids, max_new_tokens=16, eos_token_id=eos)
        trees.vanilla(ids, max_new_tokens=16, eos_token_id=eos)
        trees.generate(ids, max_new_tokens=16, eos_token_id=eos)
    for i, ids in enumerate(prompts):
        runs = [("vanilla bfloat16+aten", plain, None), ("vanilla float32+packed", trees, None)]
        order = shapes[i % len(shapes):] + shapes[: i % len(shapes)]
        runs += [(f"strict {s.label}", trees, s) for s in order]
        reference = None
        for label, gen, shape in runs:
            start = time.perf_counter()
            if shape is None:
                out = gen.vanilla(ids, max_new_tokens=args.new_tokens, eos_token_id=eos)
            else:
                gen.use_tree(shape)
                out = gen.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=eos)
            took = time.perf_counter() - start
            if label == "vanilla float32+packed":
                reference = out.tokens
            elif shape is not None:
                assert out.tokens == reference, f"strict {shape.label} differs from plain decoding at its kernels"
            t = totals.setdefault(label, [0, 0.0, 0])
            t[0] += len(out.tokens) - 1
            t[1] += took
            t[2] += getattr(out, "num_cycles", 0) or 0
        print(f"question {i + 1}/{len(prompts)} done", flush=True)
fastest = max(t[0] / t[1] for label, t in totals.items() if label.startswith("vanilla"))
result = {"cpu": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
          "question_ids": [q.question_id for q in questions], "new_tokens": args.new_tokens, "results": {}}
for label, (tokens, seconds, cycles) in totals.items():
    result["results"][label] = {"tokens_per_s": tokens / seconds, "vs_fastest_plain": tokens / seconds / fastest,
                                "tau": tokens / cycles if cycles else 1.0, "tokens": tokens}
    print(f"{label:24s} {tokens / seconds:6.1f} tok/s  {tokens / seconds / fastest:.3f}x  "
          f"tau {result['results'][label]['tau']:.2f}")
with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
