"""Feature-stage rate (`FeatureStore.build`) on SmolLM2: the prompts of a `rate.py` run (cut to 192 tokens) and
their answers, padded to 384; layers [2, 15, 27], top-32, batches of 8 (the CPU build's), shards of 64.

    ANSWERS=/tmp/r_pack64.json python feat.py OUTDIR COUNT
"""

import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle.train.data import FeatureStore, _pad_sequences, read_jsonl, record_prompt

TARGET = os.environ.get("TARGET", "/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e")
tokenizer = AutoTokenizer.from_pretrained(TARGET)
model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
prompts = [record_prompt(r, tokenizer)[:192] for r in read_jsonl("data/prompts/smollm2_train.jsonl")]
answers = json.load(open(os.environ["ANSWERS"]))["answers"]
keys = sorted(answers, key=int)[: int(sys.argv[2])]
rows = [(prompts[int(k)] + answers[k])[:384] for k in keys]
seqs = _pad_sequences(rows, [len(prompts[int(k)]) for k in keys], 384, tokenizer.pad_token_id)
started = time.perf_counter()
FeatureStore(sys.argv[1], seqs, shard_size=64).build(model, [2, 15, 27], 32, 8, log=lambda _: None)
seconds = time.perf_counter() - started
tokens = int(seqs.lengths.sum())
print(json.dumps({"cap": torch.backends.cpu.get_cpu_capability(), "sequences": len(rows), "tokens": tokens,
                  "padded_tokens": len(rows) * 384, "s": seconds, "tok_s": tokens / seconds}))
