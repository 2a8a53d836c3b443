"""Choose an EAGLE-3 draft vocabulary size for a target by measurement: what each size covers and costs.

A draft head predicts over the N most frequent tokens of the target's own answers (`d2t` maps them back).
A token outside them can never be drafted, so the share of answer tokens inside the top N bounds the
acceptance per step; the head's output layer costs N x hidden per drafted row, on a small target a large
share of a target decode. This script: the target answers `--prompts` chat prompts greedily (batched,
in the precision eagle.precision picks), token frequencies are counted on half of the answers and
coverage measured on the other half, and the output layer's time at each size (float32 and bf16, 1 and
8 rows, the rows a draft step expands) is set beside one float32 target decode. Writes JSON.

    python scripts/draft_vocab.py --target DIR --prompts runs/smollm2/prompts.jsonl --out vocab.json
    python scripts/draft_vocab.py --target DIR --sequences runs/smollm2/draft/data/sequences.pt --out vocab.json

`--sequences`: count and score on a training run's sequences instead (the target's own answers the head
trains on, `eagle.train.draft --generate`; its answer tokens are where the loss mask is set), shuffled with a
fixed seed before halving (the file holds the greedy answers, then the sampled ones).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle.config import eos_token_ids
from eagle.precision import resolve_dtype
from eagle.train.data import Sequences, read_jsonl, record_prompt
from mars.adapter.cache import cache_keyword

SIZES = (4096, 8192, 16384, 32768)


def best_ms(fn, repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 4]  # the lower quartile: the cost without the machine's noise


def generated_answers(args, model, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, answers): --prompts encoded and answered greedily by the target; the answers are kept in
    OUT.answers.json, so that a rerun only measures again."""
    prompts = [record_prompt(r, tokenizer) for _, r in zip(range(args.count), read_jsonl(args.prompts), strict=False)]
    eos = eos_token_ids(model, tokenizer)
    answers: list[list[int]] = []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.perf_counter()
    kept = Path(args.out + ".answers.json")
    if kept.exists():
        answers = json.loads(kept.read_text())
    for b in range(len(answers), len(prompts), args.batch):
        group = prompts[b: b + args.batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.tokens,
                                 pad_token_id=pad)[:, width:].tolist()
        for row in out:
            cut = next((i for i, t in enumerate(row) if t in eos), len(row))
            answers.append(row[:cut])
        print(f"answered {len(answers)}/{len(prompts)} ({time.perf_counter() - start:.0f} s)", flush=True)
        kept.write_text(json.dumps(answers))
    return prompts, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="JSONL of chat records (eval.chat_prompts): the target answers them")
    source.add_argument("--sequences", help="a training run's sequences.pt: the answers it holds")
    ap.add_argument("--count", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="draft vocabulary sizes to score")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=resolve_dtype("auto").dtype).eval()
    if args.sequences:
        seqs = Sequences.load(Path(args.sequences))
        answers = [row[1:][mask[:-1]].tolist() for row, mask in zip(seqs.input_ids, seqs.loss_mask, strict=True)]
        random.Random(0).shuffle(answers)
        first = int(seqs.loss_mask[0].nonzero()[0])  # the first sequence's prompt: the context a decode is timed at
        prompts = [seqs.input_ids[0, :first + 1].tolist()]
    else:
        prompts, answers = generated_answers(args, model, tokenizer)
    half = len(answers) // 2
    counts = torch.bincount(torch.tensor([t for a in answers[:half] for t in a]), minlength=model.config.vocab_size)
    order = counts.argsort(descending=True)
    scored = torch.tensor([t for a in answers[half:] for t in a])
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    full = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]])
    with torch.inference_mode():
        past = full(ids, use_cache=True).past_key_values
        step = torch.tensor([[prompts[0][-1]]])

        def decode() -> None:
            full(step, **{cache_keyword(full): past}, use_cache=True)
            past.crop(-1)  # drop the token just decoded: every call decodes at the same length

        decode_ms = best_ms(decode)
        sizes = {}
        for n in sorted({*args.sizes, vocab}):
            if n > vocab:
                continue
            inside = torch.zeros(vocab, dtype=torch.bool)
            inside[order[:n]] = True
            row = {"coverage": inside[scored].float().mean().item()}
            for dtype in (torch.float32, torch.bfloat16):
                layer = torch.nn.Linear(hidden, n, bias=False, dtype=dtype)
                for rows in (1, 8):
                    x = torch.randn(rows, hidden, dtype=dtype)
                    name = f"lm_head_ms_{str(dtype).removeprefix('torch.')}_{rows}"
                    row[name] = best_ms(lambda layer=layer, x=x: layer(x))
            sizes[n] = row
            print(n, row, flush=True)
    result = {"target": args.target, "source": args.sequences or args.prompts, "answers": len(answers),
              "answer_tokens": sum(map(len, answers)),
              "counted_on": half, "scored_on": len(answers) - half, "decode_ms_float32": decode_ms,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              "sizes": sizes}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
