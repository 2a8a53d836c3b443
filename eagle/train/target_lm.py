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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of `python -m eagle.train.target_lm` (see the module docstring)."""
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
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train (or resume) the target, then score it on held-out data and save it to <out>/final."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, train_tokens, heldout_tokens = _tokens(args, out)
    torch.manual_seed(args.seed)
    run = _Run(args, _fresh_model(args, tokenizer), out / "checkpoint.pt")
    n_params = sum(p.numel() for p in run.model.parameters())
    print(f"params {n_params / 1e6:.1f}M", flush=True)
    if not run.train(train_tokens, open(out / "train_log.jsonl", "a")):
        return
    run.save()
    _finish(run, tokenizer, heldout_tokens, out, n_params)


def _tokens(args: argparse.Namespace, out: Path) -> tuple:
    """The tokenizer (trained once, kept in <out>/tokenizer) and the corpus's train and held-out tokens."""
    from transformers import AutoTokenizer

    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(tok_dir, args.vocab_size, args.corpus_root)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    train_tokens = tokenize_split(tokenizer, "train", out / "cache" / "train.pt", args.corpus_root)
    heldout_tokens = tokenize_split(tokenizer, "heldout", out / "cache" / "heldout.pt", args.corpus_root)
    print(f"train tokens {len(train_tokens):,}  held-out tokens {len(heldout_tokens):,}", flush=True)
    return tokenizer, train_tokens, heldout_tokens


def _fresh_model(args: argparse.Namespace, tokenizer):
    """A randomly initialised Llama of `DEFAULT_SHAPE` (with --shape's overrides) for the tokenizer's vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**DEFAULT_SHAPE, **args.shape},
    )
    return LlamaForCausalLM(config)


class _Run:
    """A training run's model, optimiser and window sampler, and where it stands: its step and its wall time
    summed over resumes (the schedule follows whichever of --steps or --minutes runs out first)."""

    def __init__(self, args: argparse.Namespace, model, ckpt: Path):
        self.args, self.model, self.ckpt = args, model, ckpt
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.gen = torch.Generator().manual_seed(args.seed)
        self.step, self.elapsed_before = 0, 0.0
        self.t0 = 0.0  # the wall clock as training starts (`train` sets it)
        if ckpt.exists():
            state = torch.load(ckpt, weights_only=False)
            model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.gen.set_state(state["generator"])
            self.step = state["step"]
            self.elapsed_before = state.get("elapsed", 0.0)
            print(f"resumed from step {self.step}", flush=True)

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.t0

    def progress(self) -> float:
        return max(self.step / self.args.steps, self.elapsed() / (self.args.minutes * 60))

    def save(self) -> None:
        save_atomic({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                     "generator": self.gen.get_state(), "step": self.step, "elapsed": self.elapsed()}, self.ckpt)

    def train(self, tokens: torch.Tensor, log) -> bool:
        """Train until the schedule's end (True) or --stop-at (False: saved, to be resumed); `log` gets a JSON
        line every --log-every steps."""
        args, model, opt = self.args, self.model, self.opt
        self.t0 = t_last = time.time()
        model.train()
        while self.progress() < 1.0:
            batch = random_batch(tokens, args.batch, args.seq, self.gen)
            for group in opt.param_groups:
                group["lr"] = lr_at(self.step, self.progress(), args.lr, args.warmup)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            self.step += 1
            if self.step % args.log_every == 0:
                rate = args.batch * args.seq * args.log_every / (time.time() - t_last)
                t_last = time.time()
                print(f"step {self.step} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} tok/s {rate:.0f}",
                      flush=True)
                log.write(json.dumps({"step": self.step, "loss": loss.item()}) + "\n")
                log.flush()
            if self.step % args.save_every == 0 or self.step == args.stop_at:
                self.save()
            if self.step == args.stop_at:
                print(f"stopped at step {self.step}; rerun the same command to resume", flush=True)
                return False
        return True


def _finish(run: _Run, tokenizer, heldout_tokens: torch.Tensor, out: Path, n_params: int) -> None:
    """The held-out loss, and the model saved in bf16 with its tokenizer and summary to <out>/final."""
    args, model, step = run.args, run.model, run.step
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
