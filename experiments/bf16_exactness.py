"""Why bf16 strict greedy verification left plain bf16 decoding on SmolLM2, and whether it still does.

    python experiments/bf16_exactness.py OUT.json [--model smollm2] [--prompts 16] [--tokens 64] [--tree 20/4/5]

Verification multiplies every weight by the tree's rows at once, plain decoding by one row; the
attention is already made row-exact (`mars/adapter/exact.py`), so what is left are the products.
For each distinct linear shape of the target (and head), in the run's precision:
  - `lone_row_differs` / `most_rows`: whether oneDNN's packed product of a lone row differs from the same row
    among several, and above how many rows another kernel takes over (`compute.kernels.row_blocks`: such shapes
    get a lone row as two and many rows in blocks);
Then strict greedy with the model's head against our plain decoding, in bf16 with exact attention and
packed weights, on the held-out chat prompts, twice, interleaved per prompt: with the two-row product
and blocks where the probe asks for them (the engine as it is), and with every count in one call (as before).
A prompt counts as identical when strict's tokens equal plain decoding's, token for token.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from compute import kernels
from eagle.checkpoint import load_draft
from eagle.config import eos_token_ids
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from eval.rundirs.jsonl import read_jsonl
from mars import SpeculativeGenerator, TreeShape


def shapes(*models: torch.nn.Module) -> dict[str, dict]:
    """Each distinct (fan_in, fan_out, dtype) of the models' linears: its modules' names and the probe's answer."""
    found: dict[tuple[int, int, torch.dtype], list[str]] = {}
    for model in models:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                fan_out, fan_in = module.weight.shape
                found.setdefault((fan_in, fan_out, module.weight.dtype), []).append(name)
    return {f"{i}->{o} {str(d).removeprefix('torch.')}": {
        **asdict(kernels.row_blocks(i, o, d) if kernels.packs(d) else kernels.AS_TORCH_DOES),
        "modules": len(names), "example": names[0]} for (i, o, d), names in found.items()}


def compare(model, head, tree: TreeShape, prompts: list[list[int]], tokens: int, eos: list[int]) -> dict:
    """Strict greedy vs plain decoding per prompt, with the engine's products and with every count in one call."""
    real = kernels.row_blocks
    result = {"fixed": {"identical": 0, "differing": []}, "one_call": {"identical": 0, "differing": []}}
    with SpeculativeGenerator(model, head, tree, exact_attention=True, prepack=True) as gen:
        for i, ids in enumerate(prompts):
            ids = torch.tensor([ids])
            for variant in result:  # interleaved per prompt
                kernels.row_blocks = real if variant == "fixed" else (lambda *_: kernels.AS_TORCH_DOES)
                try:
                    plain = gen.vanilla(ids, max_new_tokens=tokens, eos_token_id=eos)
                    spec = gen.generate(ids, max_new_tokens=tokens, eos_token_id=eos)
                finally:
                    kernels.row_blocks = real
                same = spec.tokens == plain.tokens
                result[variant]["identical"] += same
                if not same:
                    shorter = min(len(spec.tokens), len(plain.tokens))
                    first = next((j for j in range(shorter) if spec.tokens[j] != plain.tokens[j]), shorter)
                    result[variant]["differing"].append({"prompt": i, "first_differing_token": first})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="smollm2", help="a model config of configs/model/")
    parser.add_argument("--draft", help="default: the model config's draft")
    parser.add_argument("--prompt-file", default=str(REPO_ROOT / "data" / "prompts" / "smollm2_heldout.jsonl"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tree", default="20/4/5", help="total/depth/branching")
    args = parser.parse_args()
    if not kernels.packs(torch.bfloat16):
        raise SystemExit("this CPU's oneDNN cannot pack bf16 weights (it needs AVX-512 BF16, and no "
                         "ONEDNN_MAX_CPU_ISA limit below it): bf16 is not chosen here, nothing to check")
    pair = JobPair.of(f"model={args.model}")
    model = pair.target("bfloat16")
    head = load_draft(args.draft or str(REPO_ROOT / pair.config.model.draft), model)
    eos = sorted(eos_token_ids(model, pair.tokenizer))
    texts = [r["messages"][0]["content"] for r in read_jsonl(args.prompt_file).values()][: args.prompts]
    total, depth, branching = map(int, args.tree.split("/"))
    start = time.perf_counter()
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "model": args.model, "dtype": "bfloat16", "tokens": args.tokens, "prompts": len(texts),
              "tree": args.tree, "shapes": shapes(model, head)}
    report["strict_vs_plain"] = compare(model, head, TreeShape(total, depth, branching, drafting="topk"),
                                        [pair.encode(t) for t in texts], args.tokens, eos)
    report["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
