"""How fast the target answers the draft-training prompts: the build's old path (`model.generate` per batch,
every row kept until the longest ends) against continuous batching (`eagle.train.answering`), per precision
and batch size, at real answer lengths. Writes JSON (answer tokens per second of wall time, per configuration).

    python experiments/answer_rate.py --target DIR --prompts data/prompts/smollm2_heldout.jsonl --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from eagle.config import eos_token_ids
from eagle.train.answering import LoopCap, answer_prompts
from eagle.train.data import read_jsonl, record_prompt


@torch.no_grad()
def generate_batches(model, prompts: list[list[int]], seq_len: int, batch: int, eos: frozenset[int], pad: int) -> int:
    """The build's old path: `model.generate` over batches of similar-length prompts, left-padded, every row
    decoded until the batch's longest answer ends. Returns the answer tokens written (up to each first EOS)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    tokens = 0
    for b in range(0, len(order), batch):
        group = [prompts[i][: seq_len // 2] for i in order[b : b + batch]]
        width = max(len(p) for p in group)
        device = next(model.parameters()).device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=seq_len - width, do_sample=False,
                             pad_token_id=pad, eos_token_id=sorted(eos))[:, width:]
        for row in out.tolist():
            ends = [k for k, t in enumerate(row) if t in eos]
            tokens += ends[0] + 1 if ends else len(row)
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--configs", nargs="+", default=["generate:bfloat16:32", "generate:float32:32",
                                                      "continuous:bfloat16:64", "continuous:bfloat16:32",
                                                      "continuous:float32:32", "continuous-nocap:bfloat16:64"])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the GPU build's answering rate)")
    ap.add_argument("--temperature", type=float, default=0.0, help="continuous answering's temperature")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    prompts = [record_prompt(r, tokenizer) for r in read_jsonl(args.prompts)][: args.count]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = []
    for config in args.configs:
        path, dtype, batch = config.split(":")
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=getattr(torch, dtype)).to(args.device).eval()
        eos = eos_token_ids(model, tokenizer)
        t0 = time.perf_counter()
        if path == "generate":
            tokens = generate_batches(model, prompts, args.seq_len, int(batch), eos, pad)
            row = {"answer_tokens": tokens, "seconds": time.perf_counter() - t0}
        else:
            cap = None if path.endswith("nocap") else LoopCap()
            _, stats = answer_prompts(model, prompts, args.seq_len, eos, pad, batch_size=int(batch), loop_cap=cap,
                                      temperature=args.temperature, log=lambda _: None)
            row = {"answer_tokens": stats.answer_tokens, "seconds": stats.seconds, "looped": stats.looped,
                   "capped": stats.capped, "row_steps": stats.row_steps}
        row.update(config=config, tokens_per_s=row["answer_tokens"] / row["seconds"])
        print(json.dumps(row), flush=True)
        rows.append(row)
    meta = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "temperature": args.temperature,
            "prompts": args.prompts, "count": len(prompts), "seq_len": args.seq_len, "threads": torch.get_num_threads()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
