"""Transposed-weight products (x @ W^T stored contiguous) for every target linear against torch's own (MKL), paired
in one process: per prompt, vanilla then strict under each, in the order MKL, transposed, transposed, MKL. The
question: does the cheaper many-row product (a cache-hot microbenchmark reads it up to 2x faster at 5-9 rows) raise
strict's ratio to plain decoding, or does plain decoding gain as much? Writes JSON.

    python docs/measurements/2026-11-29-xeon-amx-cycle-cuts/transposed_paired.py OUT.json [--tree 6/6/1]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from contextlib import contextmanager
from functools import partial

import torch

from eagle.checkpoint import load_draft
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from mars import SpeculativeGenerator, TreeShape


def transposed_forward(weight_t: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    y = torch.matmul(x, weight_t)
    return y if bias is None else y + bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--tree", default="6/6/1")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    pair = JobPair.of(f"model={args.model}")
    model = pair.target("float32")
    head = load_draft(str(REPO_ROOT / pair.config.model.draft), model)
    prompts = [torch.tensor([p]) for p in pair.prompts(args.prompts)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    transposed = {m: m.weight.detach().t().contiguous() for m in linears}

    @contextmanager
    def kernels(name: str):
        if name == "mkl":
            yield
            return
        for m in linears:
            m.forward = partial(transposed_forward, transposed[m], m.bias)
        try:
            yield
        finally:
            for m in linears:
                del m.forward

    sums: dict[tuple[str, str], list[float]] = {}
    paired, identical = [], True
    with SpeculativeGenerator(model, head, TreeShape(*map(int, args.tree.split("/"))), prepack=False) as gen:
        for name in ("mkl", "wt"):
            with kernels(name):
                gen.generate(prompts[0], max_new_tokens=16)
                gen.vanilla(prompts[0], max_new_tokens=16)
        for ids in prompts:
            seconds, tokens = {}, {}
            for name in ("mkl", "wt", "wt", "mkl"):
                with kernels(name):
                    for kind in ("vanilla", "strict"):
                        start = time.perf_counter()
                        out = (gen.vanilla(ids, max_new_tokens=args.tokens) if kind == "vanilla"
                               else gen.generate(ids, max_new_tokens=args.tokens))
                        elapsed = time.perf_counter() - start
                        total = sums.setdefault((name, kind), [0, 0.0])
                        total[0] += len(out.tokens)
                        total[1] += elapsed
                        seconds[name, kind] = seconds.get((name, kind), 0.0) + elapsed
                        tokens.setdefault((name, kind), list(out.tokens))
            identical &= all(tokens[name, "strict"] == tokens[name, "vanilla"] for name in ("mkl", "wt"))
            paired.append([seconds["mkl", "vanilla"] / seconds["mkl", "strict"],
                           seconds["wt", "vanilla"] / seconds["wt", "strict"],
                           seconds["mkl", "vanilla"] / seconds["wt", "vanilla"],
                           seconds["mkl", "strict"] / seconds["wt", "strict"]])
    speed = {f"{name} {kind}": n / s for (name, kind), (n, s) in sums.items()}
    means = [math.exp(sum(math.log(p[i]) for p in paired) / len(paired)) for i in range(4)]
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "model": args.model,
              "tree": args.tree, "prompts": args.prompts, "tokens": args.tokens, "tokens_per_s": speed,
              "speedup_mkl": speed["mkl strict"] / speed["mkl vanilla"],
              "speedup_wt": speed["wt strict"] / speed["wt vanilla"],
              "per_prompt_geomeans": dict(zip(("speedup_mkl", "speedup_wt", "vanilla_wt_over_mkl",
                                               "strict_wt_over_mkl"), means, strict=True)),
              "strict_equals_vanilla_in_each": identical}
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as f:
        f.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
