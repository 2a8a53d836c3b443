"""Tokens/s of the embedded pair with static shapes, eager and compiled, against the dynamic path.

Strict greedy speculation and plain decoding (`vanilla`) of the same adapter, float32, methods
interleaved prompt by prompt; every output is checked against the dynamic path's plain decoding.
The first call of the compiled generator compiles its two graphs and is timed apart.

    python experiments/static_speed.py [--prompts 8] [--tokens 128] [--threads 1] [--max-cache-len 512]
                                       [--compile default|none]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle import load_draft
from eval.rundirs.jsonl import read_jsonl
from mars import SpeculativeGenerator, TreeShape

TREE = dict(total_tokens=8, depth=4, branching=2)  # the embedded pair's calibrated greedy tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="data/models/target")
    parser.add_argument("--draft", default="data/models/draft")
    parser.add_argument("--questions", default="data/prompts/stdlib_heldout.jsonl")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-cache-len", type=int, default=512)
    parser.add_argument("--compile", default="default", help="the torch.compile mode of the compiled row (none: "
                        "no compiled row; compiling the embedded target's two graphs takes ~1 min without a cache)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    head = load_draft(args.draft, target)
    questions = read_jsonl(args.questions).values()[: args.prompts]
    prompts = [tokenizer(q["prompt"], return_tensors="pt").input_ids for q in questions]
    width = args.max_cache_len
    gens = {
        "dynamic": SpeculativeGenerator(target, head, TreeShape(**TREE)),
        f"static eager {width}": SpeculativeGenerator(target, head, TreeShape(**TREE), static=True,
                                                      max_cache_len=width),
        "static eager 2048": SpeculativeGenerator(target, head, TreeShape(**TREE), static=True, max_cache_len=2048),
    }
    if args.compile != "none":
        compiled = SpeculativeGenerator(target, head, TreeShape(**TREE), static=True, compile=args.compile,
                                        max_cache_len=width)
        gens[f"static compiled {width}"] = compiled
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), "
          f"{len(prompts)} prompts x {args.tokens} tokens, tree {TREE}")
    if args.compile != "none":
        start = time.perf_counter()
        compiled.generate(prompts[0], max_new_tokens=16)
        compiled.vanilla(prompts[0], max_new_tokens=2)
        print(f"first compiled calls (both graphs compiled): {time.perf_counter() - start:.1f} s")
    for gen in gens.values():  # warm-up
        gen.generate(prompts[0], max_new_tokens=16)
        gen.vanilla(prompts[0], max_new_tokens=4)
    totals = {name: [0, 0.0, 0, 0.0, 0] for name in gens}
    for prompt in prompts:
        reference = None
        for name, gen in gens.items():
            spec = gen.generate(prompt, max_new_tokens=args.tokens)
            plain = gen.vanilla(prompt, max_new_tokens=args.tokens)
            reference = plain.tokens if reference is None else reference
            row = totals[name]
            row[0] += len(spec.tokens)
            row[1] += spec.seconds
            row[2] += len(plain.tokens)
            row[3] += plain.seconds
            row[4] += spec.tokens == plain.tokens == reference
    for name, (spec_tokens, spec_s, plain_tokens, plain_s, same) in totals.items():
        print(f"{name:22s} strict {spec_tokens / spec_s:6.1f} tok/s   vanilla {plain_tokens / plain_s:6.1f} tok/s   "
              f"equal to plain greedy {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
