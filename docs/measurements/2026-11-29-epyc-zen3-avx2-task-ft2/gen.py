"""Answer the rest of /work/s63/ft/mix_prompts.jsonl (the eleventh session's CPU fine-tune answered the shortest 705
in 32 min), resuming its progress files, then write the new answers alone as Sequences (the old ones keep their
feature shards). Usage: python gen.py MINUTES (split evenly between the three parts: T = 0, 0, 1)."""
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from eagle.train.answering import LoopCap
from eagle.train.data import _pad_sequences, generate_sequences, read_jsonl, record_prompt
from eagle.train.draft import load_target

T = "/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e"
OLD, W = Path("/work/s63/ft/data"), Path("/work/s66/ft")  # W/gen holds copies of OLD's generating.*.pt
minutes = float(sys.argv[1])
torch.set_num_threads(2)
target = load_target(T, torch.device("cpu"), "auto")
tok = AutoTokenizer.from_pretrained(T)
# the s63 run's prompts: its --max-tokens 817920 at --seq-len 384 took the first 2,130
prompts = [record_prompt(r, tok) for r in read_jsonl("/work/s63/ft/mix_prompts.jsonl")][: 817920 // 384]
temps = [0.0, 0.0, 1.0]
old = {i: set(torch.load(OLD / f"generating.rank0.part{i}.pt", weights_only=False)["rows"]) for i in range(3)}
new_rows, starts = [], []
for i, t in enumerate(temps):
    part = prompts[i::3]  # the CLI's split between temperatures, its seeds (args.seed + i)
    generate_sequences(target, tok, part, 384, batch_size=128, temperature=t, seed=i, log=print,
                       progress=W / f"gen/generating.rank0.part{i}.pt", loop_cap=LoopCap(), seconds=minutes * 60 / 3)
    rows = torch.load(W / f"gen/generating.rank0.part{i}.pt", weights_only=False)["rows"]
    for j in sorted(set(rows) - old[i]):
        prompt = part[j][: 384 // 2]
        new_rows.append(prompt + rows[j])
        starts.append(len(prompt))
    print(f"part {i} (T={t}): {len(rows)} answered, {len(set(rows) - old[i])} new", time.strftime("%X"), flush=True)
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
seqs = _pad_sequences(new_rows, starts, 384, pad)
seqs.save(W / "new_sequences.pt")
print("new sequences", len(seqs), "tokens", seqs.num_tokens(), flush=True)
