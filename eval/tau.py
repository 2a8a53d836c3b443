"""End-to-end acceptance of a draft head: greedy speculative decoding of held-out prompts.

    python -m eval.tau --target runs/target/final --draft runs/draft/final [--prompts 8] [--update eval.json]
    python -m eval.tau --target T --draft D --prompts-jsonl data/prompts/stdlib_heldout.jsonl --prompts 64 \
        --new-tokens 128 --total-tokens 20 --depth 4 --branching 5 --dtype float32 --no-timing

Prompts are cut from the stdlib held-out split (or a JSONL of texts) as in `eagle.train.evaluate`,
or taken whole from a JSONL of prompts (--prompts-jsonl: the benchmark's held-out functions),
whose teacher-forced agreement this complements with what decoding actually achieves: tau (tokens
per draft-verify cycle) and the wall-time speed-up over plain decoding through the same adapter
(--no-timing: tau only, no plain decoding; tau does not depend on the machine's load).
`--update FILE` writes the figures under "greedy_decoding" into an existing JSON report (the
`eval.json` that draft training leaves next to the head).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eagle.train.data import corpus_prompts, read_jsonl, record_prompt
from eagle.train.evaluate import heldout_data, load_pair, pair_arguments
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import TreeShape


@torch.inference_mode()
def measure_tau(gen: SpeculativeGenerator, prompts: list[list[int]], max_new_tokens: int = 64,
                timing: bool = True) -> dict:
    """Greedy speculative decoding of `prompts` with `gen`: tau pooled over prompts, and (`timing`) the
    speed-up over `gen.vanilla` (each prompt decoded both ways, back to back)."""
    cycles, cycle_tokens, spec_s, vanilla_s, tokens = 0, 0, 0.0, 0.0, 0
    per_prompt = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        spec = gen.generate(ids, max_new_tokens=max_new_tokens)
        per_prompt.append([spec.num_cycles, len(spec.tokens) - 1])  # so that subsets can be pooled the same way
        cycles += spec.num_cycles
        cycle_tokens += len(spec.tokens) - 1
        spec_s, tokens = spec_s + spec.seconds, tokens + len(spec.tokens)
        if timing:
            vanilla_s += gen.vanilla(ids, max_new_tokens=max_new_tokens).seconds
    figures = {"tau": cycle_tokens / cycles if cycles else 1.0, "prompts": len(prompts), "new_tokens": max_new_tokens,
               "tree": {"depth": gen.tree.depth, "branching": gen.tree.branching,
                        "total_tokens": gen.tree.total_tokens},
               "per_prompt_cycles_tokens": per_prompt}
    if timing:
        figures.update({"speedup": vanilla_s / spec_s, "spec_tokens_per_s": tokens / spec_s,
                        "vanilla_tokens_per_s": tokens / vanilla_s})
    return figures


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_arguments(ap)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--total-tokens", type=int, default=60)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--branching", type=int, default=10)
    ap.add_argument("--prompts-jsonl", help="whole prompts from this JSONL ('prompt' records) instead of cut texts")
    ap.add_argument("--no-timing", action="store_true", help="tau only: skip plain decoding and the speed-up")
    ap.add_argument("--update", help="a JSON report to add the figures to, under 'greedy_decoding' "
                    "(with --prompts-jsonl, under 'greedy_decoding_<total>/<depth>/<branching>')")
    args = ap.parse_args(argv)
    if args.prompts_jsonl and args.jsonl:
        raise SystemExit("give the prompts once: --jsonl (texts to cut prompts from) or --prompts-jsonl")
    target, tokenizer, head, cache_dir = load_pair(args)
    if args.prompts_jsonl:
        prompts = [record_prompt(r, tokenizer) for r in read_jsonl(args.prompts_jsonl)][: args.prompts]
        if not prompts:
            raise SystemExit(f"{args.prompts_jsonl} holds no prompts")
    else:
        _, tokens = heldout_data(tokenizer, args.jsonl, args.prompt_len, 1, cache_dir)
        prompts = corpus_prompts(tokens, args.prompts, args.prompt_len, seed=1)
    with SpeculativeGenerator(target, head, TreeShape(args.total_tokens, args.depth, args.branching)) as gen:
        figures = measure_tau(gen, prompts, args.new_tokens, timing=not args.no_timing)
    figures["dtype"] = str(target.dtype)
    if args.prompts_jsonl:
        figures["prompts_jsonl"] = args.prompts_jsonl
    if args.update:
        path = Path(args.update)
        report = json.loads(path.read_text())
        key = (f"greedy_decoding_{args.total_tokens}/{args.depth}/{args.branching}" if args.prompts_jsonl
               else "greedy_decoding")
        report[key] = figures
        path.write_text(json.dumps(report, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
