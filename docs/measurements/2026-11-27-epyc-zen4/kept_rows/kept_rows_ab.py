"""Exact attention's kept rows against a fresh gather per forward, in one process, prompt by prompt alternated.

    python docs/measurements/2026-11-27-epyc-zen4/kept_rows_ab.py OUT.json [--prompts 16] [--tokens 128]

The embedded pair in bf16 on packed weights with exact attention (the kernels calibration picks for bf16 trees),
greedy, held-out prompts. Arm "kept": the adapter keeps each tree row's copy of the committed keys between
forwards (`mars.adapter.exact.RowKeys`); arm "gather": the same adapter with a budget of 0 bytes, so every forward
gathers every row's keys afresh (the engine before kept rows). Both arms are the same generator class with the same
tree, so they emit the same tokens (checked); only speed differs. Plain decoding at these kernels (one row, the
identity reference of strict) is timed the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eagle.checkpoint import load_draft
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from mars import SpeculativeGenerator, TreeShape
from mars.decoding.settings import Kernels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--trees", nargs="+", default=["6/6/1", "12/4/3"])
    parser.add_argument("--model", default="embedded", help="embedded (held-out stdlib prompts) or smollm2 (MT-bench "
                        "first turns, ../shared/data/bench/mt_bench.jsonl)")
    args = parser.parse_args()
    pair = JobPair.of(f"model={args.model}")
    model = pair.target("bfloat16")
    head = load_draft(str(REPO_ROOT / pair.config.model.draft), model)
    source = REPO_ROOT / ("data/prompts/stdlib_heldout.jsonl" if args.model == "embedded"
                          else "../shared/data/bench/mt_bench.jsonl")
    lines = source.read_text().splitlines()[: args.prompts]
    prompts = [torch.tensor([pair.encode(json.loads(x).get("prompt") or json.loads(x)["turns"][0])]) for x in lines]
    exact = Kernels("bfloat16", True, True)
    report = {"model": args.model, "machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(),
              "threads": torch.get_num_threads(), "prompts": len(prompts), "tokens": args.tokens, "runs": {}}
    for shape in args.trees:
        gens = {arm: SpeculativeGenerator(model, head, TreeShape(*map(int, shape.split("/"))), prepack=True,
                                          exact_attention=True, plain_kernels=exact) for arm in ("kept", "gather")}
        gens["gather"].target.kept_rows.budget = 0
        gens["gather"].plain_target.kept_rows.budget = 0
        seconds = {f"{m} {arm}": [] for m in ("strict", "plain") for arm in gens}
        tokens = {k: 0 for k in seconds}
        with torch.inference_mode():
            for gen in gens.values():
                gen.generate(prompts[0], max_new_tokens=16)
                gen.vanilla(prompts[0], max_new_tokens=16)
            for i, prompt in enumerate(prompts):
                order = list(gens) if i % 2 == 0 else list(gens)[::-1]
                outs = {}
                for method in ("strict", "plain"):
                    for arm in order:
                        gen = gens[arm]
                        start = time.perf_counter()
                        out = (gen.generate if method == "strict" else gen.vanilla)(prompt, max_new_tokens=args.tokens)
                        seconds[f"{method} {arm}"].append(time.perf_counter() - start)
                        tokens[f"{method} {arm}"] += len(out.tokens)
                        outs[f"{method} {arm}"] = out.tokens
                assert outs["strict kept"] == outs["strict gather"] == outs["plain kept"] == outs["plain gather"], i
        for gen in gens.values():
            gen.close()
        rate = {k: round(tokens[k] / sum(v), 1) for k, v in seconds.items()}
        paired = {m: round(statistics.median(g / k for k, g in zip(seconds[f"{m} kept"], seconds[f"{m} gather"],
                                                                     strict=True)), 3) for m in ("strict", "plain")}
        report["runs"][shape] = {"tokens_per_second": rate, "median_prompt_speedup_kept_over_gather": paired,
                                 "identical_outputs": True}
        print(shape, report["runs"][shape], flush=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
