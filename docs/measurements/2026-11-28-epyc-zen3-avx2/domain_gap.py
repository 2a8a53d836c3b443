"""Where SmolLM2's head loses on MT-bench (model card, "Where MT-bench's shortfall comes from"): the target's own
greedy answers (SEQ_LEN tokens of prompt and answer, float32) to the 64 held-out prompts and to MT-bench's first
turns; per set and per MT-bench category, the head's top-1 agreement at draft steps 1-5 (teacher-forced,
`eagle.train.evaluate.evaluate_head`), the offline tau of strict greedy at 5/4/16 and 4/2/8 (`offline_tau`) and
the target's mean top-1 probability over the answer positions. Each category is scored once; a set is pooled
from its parts (positions, cycles). Answers are cached in WORK; a category's line is printed as it finishes.

    python docs/measurements/2026-11-28-epyc-zen3-avx2/domain_gap.py TARGET_DIR data/models/smollm2/draft WORK \
        [category ...]      # default: every MT-bench category
"""
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle.checkpoint import load_draft
from eagle.train.data import Sequences
from eagle.train.evaluate import continuation_data, evaluate_head, offline_tau
from eval.benchmarks import load_questions

SEQ_LEN = 256
target_dir, head_dir, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
work.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(target_dir)
head = load_draft(head_dir, target).float()


def answers(name: str, prompts: str, count: int) -> Sequences:
    cache = work / f"{name}_greedy.pt"
    if cache.exists():
        return Sequences.load(cache)
    seqs = continuation_data(target, tokenizer, prompts, SEQ_LEN, count, 0.0)
    seqs.save(cache)
    return seqs


def scores(seqs: Sequences) -> dict:
    report = evaluate_head(head, target, seqs, steps=5)
    probs = []
    with torch.no_grad():
        for n in range(len(seqs)):
            length = int(seqs.lengths[n])
            p = torch.softmax(target(seqs.input_ids[n: n + 1, :length]).logits[0].float(), -1).max(-1).values
            probs.append(p[seqs.loss_mask[n, :length]])
    probs = torch.cat(probs)
    taus = {f"{d}_{b}_{t}": offline_tau(head, target, seqs, d, b, t) for d, b, t in ((5, 4, 16), (4, 2, 8))}
    return {"sequences": len(seqs), "positions": report["steps"][0]["positions"],
            "top1": [s["acc"] for s in report["steps"]],
            "tau": {k: {"tokens": v["tokens"], "cycles": v["cycles"]} for k, v in taus.items()},
            "confidence": {"sum": float(probs.sum()), "n": len(probs)}}


def pooled(parts: list[dict]) -> dict:
    pos = sum(p["positions"] for p in parts)
    return {"sequences": sum(p["sequences"] for p in parts), "positions": pos,
            "top1": [round(sum(p["top1"][k] * p["positions"] for p in parts) / pos, 4) for k in range(5)],
            **{f"offline_tau_{k}": round(sum(p["tau"][k]["tokens"] for p in parts)
                                         / sum(p["tau"][k]["cycles"] for p in parts), 3) for k in parts[0]["tau"]},
            "target_top1_prob": round(sum(p["confidence"]["sum"] for p in parts)
                                      / sum(p["confidence"]["n"] for p in parts), 4)}


start = time.time()
result = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "head": head_dir, "sets": {}}
result["sets"]["heldout"] = pooled([scores(answers("heldout", "data/prompts/smollm2_heldout.jsonl", 64))])
print("heldout", json.dumps(result["sets"]["heldout"]), f"{time.time() - start:.0f} s", flush=True)
questions = load_questions("mt_bench")
first_turns = work / "mt_bench_first.jsonl"
first_turns.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q.turns[0]}],
                                           "category": q.category}) + "\n" for q in questions))
mt = answers("mt_bench_first", str(first_turns), len(questions))
by = defaultdict(list)
for i, q in enumerate(questions):
    by[q.category].append(i)
parts = {}
for category in sys.argv[4:] or list(by):
    parts[category] = scores(mt.select(torch.tensor(by[category])))
    print(category, json.dumps(pooled([parts[category]])), f"{time.time() - start:.0f} s", flush=True)
result["sets"]["mt_bench_first"] = pooled(list(parts.values())) | {
    "by_category": {c: pooled([p]) for c, p in parts.items()}}
(work / "domain_gap.json").write_text(json.dumps(result, indent=2) + "\n")
