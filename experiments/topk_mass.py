"""How much of the target's sampling distribution a tree of top-k drafts can cover.

With deterministic (top-k) drafts, strict tree sampling accepts some child of a node with
probability at most the target's mass on the drafted tokens, so at most its top-k mass m_k there
(whatever the draft). Summed over depths, a cycle emits at most 1 + m + m^2 + ... tokens when every
position has mass m: a ceiling on tau at a temperature, set by the target alone. This script
measures m_k on the target's own sampled continuations of held-out prompts and writes JSON.

    python experiments/topk_mass.py OUT.json [--temperature 1] [--prompts 32] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle.precision import resolve_dtype
from eval.benchmarks import load_questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--target", default="data/models/target")
    parser.add_argument("--questions", default="data/prompts/stdlib_heldout.jsonl")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 5, 8, 10])
    args = parser.parse_args()
    torch.manual_seed(0)
    dtype = resolve_dtype("auto", "cpu").dtype
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    masses: dict[int, list[float]] = {k: [] for k in args.ks}
    for question in load_questions(args.questions)[: args.prompts]:
        text_ids = tokenizer(question.turns[0])["input_ids"]
        if not text_ids or text_ids[0] != tokenizer.bos_token_id:  # a completion prompt: raw text after BOS
            text_ids = [tokenizer.bos_token_id, *text_ids]
        ids = torch.tensor([text_ids])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=args.temperature, top_k=0, max_new_tokens=args.tokens,
                                 min_new_tokens=args.tokens, pad_token_id=0)
            logits = model(out).logits[0, ids.shape[1] - 1: -1].float() / args.temperature
        probs = logits.softmax(-1).sort(dim=-1, descending=True).values
        for k in args.ks:
            masses[k].extend(probs[:, :k].sum(-1).tolist())
    summary = {}
    for k, values in masses.items():
        mean = sum(values) / len(values)
        summary[k] = {"mean_mass": round(mean, 4),
                      # E[tokens per cycle] for a chain of top-k nodes at every depth, infinitely deep
                      "tau_ceiling_infinite_depth": round(1 / (1 - mean), 3) if mean < 1 else math.inf}
    result = {"target": args.target, "dtype": str(dtype), "temperature": args.temperature,
              "positions": len(masses[args.ks[0]]), "capability": torch.backends.cpu.get_cpu_capability(),
              "top_k_mass": summary}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
