"""Train a small Llama target from scratch on the stdlib corpus (builds the embedded default).

Usage:
    python -m eagle.train.target_lm --out runs/target --minutes 90
Re-running with the same --out resumes from its last checkpoint (model, optimizer, step, RNG).
The finished model is saved with `save_pretrained` in bf16 to `<out>/final`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from eagle.files import save_atomic
from eagle.train.corpus import train_tokenizer
from eagle.train.data import tokenize_split

# Deep and narrow: on a CPU the per-layer overhead dominates, so a one-layer draft head is cheap
# only next to a deep target (see the measurements in the README / model card).
DEFAULT_SHAPE = dict(
    hidden_size=384,
    intermediate_size=1024,
    num_hidden_layers=14,  # 25M params: with the draft, under the 60 MB budget for the shipped pair in bf16
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def random_batch(tokens: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - seq - 1, (batch,), generator=gen)
    return torch.stack([tokens[s : s + seq + 1] for s in starts.tolist()]).long()


@torch.inference_mode()
def heldout_loss(model, tokens: torch.Tensor, seq: int = 512, max_windows: int = 64) -> float:
    """Mean next-token loss over `max_windows` non-overlapping windows spread evenly over the held-out
    split (files differ a lot: the first windows alone would describe only the first few files)."""
    n = min(max_windows, (len(tokens) - 1) // seq)
    stride = (len(tokens) - seq - 1) // n
    losses = []
    for i in range(n):
        window = tokens[i * stride : i * stride + seq + 1].long()[None]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(window[:, :-1]).logits.float()
        losses.append(torch.nn.functional.cross_entropy(logits[0], window[0, 1:]).item())
    return sum(losses) / len(losses)


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to 10% as `progress` goes 0 -> 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=6000, help="stop after this many steps")
    ap.add_argument("--minutes", type=float, default=90.0,
                    help="stop (and save) after this much training wall time, summed over resumes; the lr "
                         "schedule follows whichever of steps or minutes runs out first, so a slow or shared "
                         "machine still ends with a fully decayed learning rate")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--shape", type=json.loads, default={}, help="JSON overrides of the model shape")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--stop-at", type=int, default=None,
                    help="save and exit at this step, as an interruption would (rerun to resume)")
    ap.add_argument("--corpus-root", type=Path, default=None,
                    help="a directory of .py files to use instead of this Python's standard library (for tests)")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(tok_dir, args.vocab_size, args.corpus_root)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    train_tokens = tokenize_split(tokenizer, "train", out / "cache" / "train.pt", args.corpus_root)
    heldout_tokens = tokenize_split(tokenizer, "heldout", out / "cache" / "heldout.pt", args.corpus_root)
    print(f"train tokens {len(train_tokens):,}  held-out tokens {len(heldout_tokens):,}", flush=True)

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**DEFAULT_SHAPE, **args.shape},
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    step, elapsed_before = 0, 0.0
    ckpt = out / "checkpoint.pt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step = state["step"]
        elapsed_before = state.get("elapsed", 0.0)
        print(f"resumed from step {step}", flush=True)

    def elapsed() -> float:
        return elapsed_before + time.time() - t0

    def progress() -> float:
        return max(step / args.steps, elapsed() / (args.minutes * 60))

    def save() -> None:
        save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(),
                     "generator": gen.get_state(), "step": step, "elapsed": elapsed()}, ckpt)

    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.1f}M", flush=True)
    log = open(out / "train_log.jsonl", "a")
    t0 = t_last = time.time()
    model.train()
    while progress() < 1.0:
        batch = random_batch(train_tokens, args.batch, args.seq, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress(), args.lr, args.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0:
            rate = args.batch * args.seq * args.log_every / (time.time() - t_last)
            t_last = time.time()
            print(f"step {step} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} tok/s {rate:.0f}", flush=True)
            log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            log.flush()
        if step % args.save_every == 0 or step == args.stop_at:
            save()
        if step == args.stop_at:
            print(f"stopped at step {step}; rerun the same command to resume", flush=True)
            return
    save()
    model.eval()
    loss = heldout_loss(model, heldout_tokens, args.seq)
    summary = {"step": step, "heldout_loss": loss, "heldout_ppl": math.exp(loss), "params": n_params,
               "train_tokens_seen": step * args.batch * args.seq}
    print(json.dumps(summary), flush=True)
    final = out / "final"
    model.to(torch.bfloat16).save_pretrained(final)
    tokenizer.save_pretrained(final)
    (final / "training_summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
