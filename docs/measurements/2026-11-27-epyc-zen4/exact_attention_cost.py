"""What exact attention costs a bf16 tree forward on the embedded pair, and why two cheaper forms were not taken.

    python docs/measurements/2026-11-27-epyc-zen4/exact_attention_cost.py OUT.json

1. The loop's own phase clock (`profile=True`), one held-out prompt x 128 tokens, trees 6/6/1 and 12/4/3, bf16 on
   packed weights with and without exact attention (three rounds, alternated): milliseconds per cycle by phase.
2. A product of every row's queries with keys shared by every row, without copying them (`expand`, a stride-0
   batch), against the same product on copied keys: equal bits? and its time.
3. One product for every row's scores (or outputs) against each row's own product: equal bits per row count?
"""

from __future__ import annotations

import json
import sys
import time

import torch

from eagle.checkpoint import load_draft
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from mars import SpeculativeGenerator, TreeShape

KV_HEADS, GROUP, HEAD_DIM = 2, 3, 64  # the embedded target's attention: 6 query heads over 2 key/value heads


def microseconds(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return round((time.perf_counter() - start) / calls * 1e6, 1)


def phases() -> dict:
    pair = JobPair.of("model=embedded")
    model = pair.target("bfloat16")
    head = load_draft(str(REPO_ROOT / pair.config.model.draft), model)
    line = json.loads((REPO_ROOT / "data/prompts/stdlib_heldout.jsonl").read_text().splitlines()[0])
    ids = torch.tensor([pair.encode(line.get("prompt") or line["turns"][0])])
    runs: dict[str, list] = {}
    for _ in range(3):
        for shape in ("6/6/1", "12/4/3"):
            for exact in (True, False):
                tree = TreeShape(*map(int, shape.split("/")))
                with torch.inference_mode(), SpeculativeGenerator(model, head, tree, prepack=True,
                                                                  exact_attention=exact, profile=True) as gen:
                    gen.generate(ids, max_new_tokens=16)  # warm-up
                    out = gen.generate(ids, max_new_tokens=128)
                cycles = len(out.tokens) / out.tau
                runs.setdefault(f"{shape} exact={exact}", []).append(
                    {k: round(1000 * v / cycles, 2) for k, v in out.phase_seconds.items()})
    return runs


def shared_keys() -> list[dict]:
    rows = []
    for n, keys in ((13, 128), (7, 192), (13, 448)):
        q = torch.randn(KV_HEADS, n, GROUP, HEAD_DIM)
        shared = torch.randn(KV_HEADS, 1, keys, HEAD_DIM)
        expanded = shared.expand(KV_HEADS, n, keys, HEAD_DIM)
        copied = expanded.contiguous()
        rows.append({"rows": n, "keys": keys,
                     "equal_bits": torch.equal(q @ expanded.transpose(-1, -2), q @ copied.transpose(-1, -2)),
                     "expand_us": microseconds(lambda q=q, k=expanded: q @ k.transpose(-1, -2)),
                     "copied_us": microseconds(lambda q=q, k=copied: q @ k.transpose(-1, -2))})
    return rows


def one_product() -> dict:
    differs = {"scores": [], "outputs": []}
    for keys in (64, 128, 192, 256, 448, 512, 1024):
        k, v = torch.randn(keys, HEAD_DIM), torch.randn(keys, HEAD_DIM)
        for n in (2, 3, 5, 7, 9, 13, 17, 21, 31, 61):
            q = torch.randn(n * GROUP, HEAD_DIM)
            p = torch.randn(n * GROUP, keys).softmax(-1)
            scores, outputs = q @ k.T, p @ v
            for i in range(n):
                own = slice(i * GROUP, (i + 1) * GROUP)
                if not torch.equal(q[own] @ k.T, scores[own]):
                    differs["scores"].append([keys, n])
                    break
            for i in range(n):
                own = slice(i * GROUP, (i + 1) * GROUP)
                if not torch.equal(p[own] @ v, outputs[own]):
                    differs["outputs"].append([keys, n])
                    break
    return {"tried": "keys 64-1024 x rows 2-61", "differs": differs}


if __name__ == "__main__":
    torch.manual_seed(0)
    report = {"machine": machine(), "threads": torch.get_num_threads(), "phases_ms_per_cycle": phases(),
              "shared_keys_expand": shared_keys(), "one_product_for_all_rows": one_product()}
    print(json.dumps(report, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=1)
