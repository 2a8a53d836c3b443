"""Would the embedded target's tree forward be cheaper with its linear weights stored transposed ([in, out],
contiguous: `x @ Wt` instead of `F.linear(x, W)`)? A cache-hot microbenchmark of single products said up to 2x at
5-9 rows; this times the real forward: `TargetModel.score_tree` of a chain of q rows, then one node kept, over 4
held-out prompts x 40 forwards, q = 1 / 7 / 9, every linear swapped or not, 4 passes alternating which goes first.
float32, unpacked, no exact attention (the kernels calibration chose for the embedded pair on this Xeon).

    python docs/measurements/2026-11-29-xeon-amx-b4-units/transposed_weights.py OUT.json

Writes {"capability", "ms_per_forward": {"linear"|"transposed": {q: [per pass]}}, "median_ratio": {q: transposed /
linear, the median of the passes' paired ratios}}.
"""
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from eagle.tree import DraftTree
from eval.harness import JobPair

pair = JobPair.of("model=embedded", "tree.calibrate=false", "tree.total_tokens=6", "tree.depth=6", "tree.branching=1",
                  "model.dtype=float32", "model.prepack=false", "model.exact_attention=false")
gen = pair.generator(pair.settings())
target = gen.target
prompts = [torch.tensor(p) for p in pair.prompts(4)]
linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
transposed = {m: m.weight.detach().t().contiguous() for m in linears}
ROWS = (1, 7, 9)


def product(weight_t: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    y = x @ weight_t
    return y if bias is None else y + bias


def use(swapped: bool) -> None:
    for m in linears:
        if swapped:
            m.forward = partial(product, transposed[m], m.bias)
        elif "forward" in m.__dict__:
            del m.forward


def chain(q: int) -> DraftTree:
    return DraftTree(torch.randint(5, 4000, (q,)), torch.arange(-1, q - 1), torch.arange(q), torch.zeros(q))


def ms_per_forward(q: int, forwards: int = 40) -> float:
    total = 0.0
    for p in prompts:
        target.prefill(p[None], 512)
        tree = chain(q)
        for _ in range(3):
            target.score_tree(tree)
            target.keep_path([0])
        start = time.perf_counter()
        for _ in range(forwards):
            target.score_tree(tree)
            target.keep_path([0])
        total += time.perf_counter() - start
    return total / (forwards * len(prompts)) * 1e3


times: dict[str, dict[int, list[float]]] = {"linear": {q: [] for q in ROWS}, "transposed": {q: [] for q in ROWS}}
for k in range(4):
    for swapped in (False, True) if k % 2 == 0 else (True, False):
        use(swapped)
        for q in ROWS:
            times["transposed" if swapped else "linear"][q].append(round(ms_per_forward(q), 3))
use(False)
ratios = {q: [a / b for a, b in zip(times["transposed"][q], times["linear"][q], strict=True)] for q in ROWS}
result = {"capability": torch.backends.cpu.get_cpu_capability(), "ms_per_forward": times,
          "median_ratio": {q: round(statistics.median(r), 3) for q, r in ratios.items()}}
print(result)
Path(sys.argv[1]).write_text(json.dumps(result, indent=1) + "\n")
