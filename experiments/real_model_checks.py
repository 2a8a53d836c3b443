"""The engine on a real checkpoint (model=smollm2): loading, strict greedy identity and lossless strict
sampling, measured once and written as JSON (these take minutes: they are not in the suite, whose
tests of the same properties run on tiny models and on a few prompts of this one).

    python experiments/real_model_checks.py OUT.json [--model smollm2] [--draft DIR] [--sampling-draft DIR]
        [--prompts FILE] [--identity 64] [--tokens 128] [--samples 1500] [--tree 20/4/5] [--mass 1e-4]
        [--skip load identity chi2]

- load: a second load of the converted model in a fresh process (sha256 checked at conversion, the
  conversion then found by path, size and mtime): seconds from the call to a model ready to run, and
  apart from them the Python imports of torch and transformers' Llama code that any such process pays;
- identity: strict greedy speculation against `model.generate` (float32, greedy, stopping at the same
  end-of-turn ids) on the held-out chat prompts (data/prompts/smollm2_heldout.jsonl: none trained on),
  token for token, and the tokens per cycle it reached;
- chi2: strict sampling at T = 1 against the target's own distribution of the first three emitted tokens
  on a chat prompt (token 1 from the prefill, tokens 2-3 from the first cycle(s): drafted, verified,
  corrected). The exact joint p(x1) p(x2 | x1) p(x3 | x1, x2) is computed by target forwards over every
  prefix above a mass threshold; the rest of the mass is one cell. One χ² goodness-of-fit test per
  drafting mode (top-k trees and sampled trees, with the head eval.run samples with) and one of our plain
  decoding (vanilla, the other lossless row of a T = 1 table), p > 0.01 passes,
  as the suite's tests of the tiny models do (tests/test_lossless.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from eagle.checkpoint import load_draft
from eagle.config import eos_token_ids
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from eval.rundirs.jsonl import read_jsonl
from mars import SamplingConfig, SpeculativeGenerator, TreeShape
from mars.accounting.stats import chi_square_pvalue
from mars.adapter.sources import provenance

CHI2_PROMPT = "Name a primary colour."  # a chat question whose first tokens spread over a few answers
MASS = 1e-4  # prefixes below this probability are not expanded: their mass is the "other" cell (--mass)
MIN_EXPECTED = 5.0

LOAD_SNIPPET = """
import sys, time
start = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
from mars.adapter.sources import local_model
imported = time.perf_counter()  # what any process using transformers pays once (Python imports)
directory = local_model(sys.argv[1], None if sys.argv[2] == "None" else sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
AutoTokenizer.from_pretrained(directory)
with torch.inference_mode():
    model(torch.tensor([[1, 2, 3]]))
print(imported - start, time.perf_counter() - imported)
"""


def second_load(pair: JobPair) -> dict:
    """Later loads of the converted model, each in a fresh process: (imports, load) seconds."""
    directory = pair.source  # converted (and checked) if not yet
    m = pair.config.model
    imports, loads = [], []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", LOAD_SNIPPET, m.target, str(m.target_sha256)],
                             capture_output=True, text=True, check=True, cwd=REPO_ROOT)
        a, b = map(float, out.stdout.strip().splitlines()[-1].split())
        imports.append(a)
        loads.append(b)
    return {"imports_s": imports, "load_s": loads, "median_load_s": sorted(loads)[1],
            "median_process_s": sorted(a + b for a, b in zip(imports, loads, strict=True))[1],
            "directory": directory, "provenance": provenance(directory)}


def identity(pair: JobPair, model, head, tree: TreeShape, prompts: list[str], tokens: int) -> dict:
    gen = SpeculativeGenerator(model, head, tree)
    eos = sorted(eos_token_ids(model, pair.tokenizer))
    same, taus, differing = 0, [], []
    for i, text in enumerate(prompts):
        ids = torch.tensor([pair.encode(text)])
        with torch.inference_mode():
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                                      do_sample=False, eos_token_id=eos, pad_token_id=eos[0])[0, ids.shape[1]:].tolist()
        out = gen.generate(ids, max_new_tokens=tokens, eos_token_id=eos)
        if out.tokens == expected:
            same += 1
        else:
            differing.append(i)
        taus.append((len(out.tokens) - 1) / max(len(out.accept_lengths), 1))
    return {"prompts": len(prompts), "identical": same, "differing": differing, "tree": tree.label,
            "tau_mean_per_prompt": sum(taus) / len(taus)}


@torch.inference_mode()
def exact_joint(model, ids: torch.Tensor, depth: int = 3, mass: float = MASS) -> dict[tuple[int, ...], float]:
    """{(x1, .., x_depth): p} for every prefix of probability >= `mass` at every step (T = 1, no filtering);
    the rest of the mass under key ("other",)."""
    frontier = {(): 1.0}
    for _ in range(depth):
        prefixes = list(frontier)
        nxt = {}
        for start in range(0, len(prefixes), 32):
            chunk = prefixes[start:start + 32]
            batch = torch.stack([torch.cat([ids[0], torch.tensor(p, dtype=torch.long)]) for p in chunk])
            probs = model(batch).logits[:, -1].float().softmax(-1).double()
            for prefix, row in zip(chunk, probs, strict=True):
                joint = frontier[prefix] * row
                keep = (joint >= mass).nonzero().flatten().tolist()
                nxt.update({prefix + (x,): float(joint[x]) for x in keep})
        frontier = nxt
    frontier[("other",)] = 1.0 - sum(frontier.values())
    return frontier


def chi2(pair: JobPair, model, head, tree: TreeShape, samples: int, seed: int = 0, mass: float = MASS,
         prompt: str = CHI2_PROMPT, plain: bool = False) -> dict:
    """One χ² test of strict sampling over `tree` (`plain`: of our plain decoding, vanilla, instead)."""
    ids = torch.tensor([pair.encode(prompt)])
    exact = exact_joint(model, ids, mass=mass)
    gen = SpeculativeGenerator(model, head, tree)
    decode = gen.vanilla if plain else gen.generate
    cfg = SamplingConfig(temperature=1.0)
    counts, accepted = Counter(), 0
    generator = torch.Generator().manual_seed(seed)
    for _ in range(samples):
        out = decode(ids, cfg, max_new_tokens=3, generator=generator)
        key = tuple(out.tokens[:3])
        counts[key if key in exact else ("other",)] += 1
        accepted += max(out.accept_lengths[:1], default=0)
    p = chi_square_pvalue(counts, exact, MIN_EXPECTED)
    cells = sorted(exact, key=exact.get, reverse=True)
    return {"method": "vanilla" if plain else "strict", "drafting": None if plain else tree.drafting,
            "tree": None if plain else tree.label,
            "samples": samples, "cells_before_pooling": len(exact),
            "p_value": p, "passes": p > 0.01, "first_cycle_accepted_mean": accepted / samples, "prompt": prompt,
            "top_cells": {" ".join(map(str, c)): {"exact": exact[c], "observed": counts.get(c, 0) / samples}
                          for c in cells[:8] if c != ("other",)},
            "other_mass": exact[("other",)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="smollm2", help="a model config of configs/model/ (default smollm2)")
    parser.add_argument("--draft", help="default: the model config's draft")
    parser.add_argument("--sampling-draft", help="default: the model config's sampling_draft, else its draft")
    parser.add_argument("--prompts", default=str(REPO_ROOT / "data" / "prompts" / "smollm2_heldout.jsonl"))
    parser.add_argument("--identity", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--tree", default="20/4/5", help="total/depth/branching")
    parser.add_argument("--mass", type=float, default=MASS, help="the chi-square test's smallest cell")
    parser.add_argument("--chi2-prompt", default=CHI2_PROMPT, help="the user turn the chi-square test samples after")
    parser.add_argument("--skip", nargs="*", default=[], choices=["load", "identity", "chi2"])
    args = parser.parse_args()
    pair = JobPair.of(f"model={args.model}")
    m = pair.config.model
    draft = args.draft or str(REPO_ROOT / m.draft)
    sampling_draft = args.sampling_draft or str(REPO_ROOT / (m.sampling_draft or m.draft))
    total, depth, branching = map(int, args.tree.split("/"))
    tree = TreeShape(total, depth, branching, drafting="topk")
    torch.manual_seed(0)
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    if "load" not in args.skip:
        report["load"] = second_load(pair)
    model = pair.target("float32")
    head = load_draft(draft, model)
    if "identity" not in args.skip:
        prompts = [r["messages"][0]["content"] for r in read_jsonl(args.prompts).values()][:args.identity]
        start = time.perf_counter()
        report["identity"] = {**identity(pair, model, head, tree, prompts, args.tokens),
                              "tokens": args.tokens, "seconds": time.perf_counter() - start}
    if "chi2" not in args.skip:
        # The head eval.run samples with, in both drafting modes (model.sampling_draft, else model.draft).
        same = Path(sampling_draft).resolve() == Path(draft).resolve()
        sampling_head = head if same else load_draft(sampling_draft, model)
        sampled = TreeShape(total, depth, branching, drafting="sample")
        report["chi2"] = [chi2(pair, model, sampling_head, shape, args.samples, seed, args.mass, args.chi2_prompt)
                          for seed, shape in enumerate([tree, sampled])]
        # Our plain decoding at T = 1, the table's vanilla row: the same test of the same prompt.
        report["chi2"].append(chi2(pair, model, sampling_head, tree, args.samples, 2, args.mass, args.chi2_prompt,
                                   plain=True))
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "load"}, indent=2)[:3000])


if __name__ == "__main__":
    main()
