"""Answering rate of `eagle.train.answering` on SmolLM2, greedy, up to 384 tokens.

    PROMPTS=data/prompts/smollm2_train.jsonl [B=128] [PACK=1] python rate.py OUT.json COUNT

PACK=1: prepacked oneDNN products. At 5d30c8f, before `answer_prompts` packed by itself, the run wrapped the call in
`eagle.kernels.PackedLinears(model).active()`, the same products.
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle.config import eos_token_ids
from eagle.train.answering import answer_prompts
from eagle.train.data import read_jsonl, record_prompt

TARGET = os.environ.get("TARGET", "/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e")
batch, pack = int(os.environ.get("B", "64")), bool(os.environ.get("PACK"))
tokenizer = AutoTokenizer.from_pretrained(TARGET)
model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
records = read_jsonl(os.environ.get("PROMPTS", "data/prompts/smollm2_heldout.jsonl"))
prompts = [record_prompt(r, tokenizer) for r in records][: int(sys.argv[2])]
answers, stats = answer_prompts(model, prompts, 384, eos_token_ids(model, tokenizer), tokenizer.pad_token_id,
                                batch_size=batch, log=lambda _: None, prepack=pack)
row = {"cap": torch.backends.cpu.get_cpu_capability(), "answers": stats.answers, "tokens": stats.answer_tokens,
       "s": stats.seconds, "tok_s": stats.tokens_per_s, "row_steps": stats.row_steps, "batch": batch, "pack": pack,
       "looped": stats.looped, "capped": stats.capped}
print(json.dumps(row))
with open(sys.argv[1], "w") as f:
    json.dump({"stats": row, "answers": {str(k): v for k, v in answers.items()}}, f)
