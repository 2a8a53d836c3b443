"""Train an EAGLE-3 (or EAGLE-1) draft head for a Hugging Face causal LM target.

Usage:
    python -m eagle.train.draft --target runs/target/final --out runs/draft --seq-len 512 --max-tokens 600000
    accelerate launch -m eagle.train.draft --target PATH --out DIR --data-jsonl sharegpt.jsonl --generate ...

Pipeline (each stage is kept in --out and skipped when rerun, so an interrupted run resumes):
  1. training sequences -> <data-dir>/sequences.pt: the stdlib train split (default) or a JSONL of
     texts/conversations, tokenised with the target's tokenizer and cut to --seq-len; with
     --generate, the target's own continuations of prompts taken from them (EAGLE-3's recipe),
     greedy and/or sampled (--gen-temperature 0 1: the prompts split between the temperatures).
  2. draft vocabulary: the --draft-vocab-size most frequent next tokens of those sequences.
  3. target features, precomputed to <data-dir>/shard_*.pt (bf16 features, and the target's
     distribution: its top-k, or with --target-dist full its last hidden state, from which the exact
     full temperature-1 distribution is recomputed each step); --online computes them every step
     instead (see eagle.train.data for the trade-offs).
     The loss follows the distribution (eagle.train.ttt): soft cross-entropy against the renormalised
     top-k, or forward KL against the full distribution (a head distilled for sampled drafting).
  4. training-time-test training (eagle.train.ttt), AdamW + warmup/cosine, from a fresh head or from
     an existing draft (--init: fine-tune, e.g. a head trained on human text, on the target's own
     outputs); bf16 autocast where the hardware has native bf16 (--precision auto), else float32;
     <out>/checkpoint.pt every --save-every steps (atomic); rerunning with the same --out resumes.
  5. <out>/final: `eagle.checkpoint.save_draft` (public EAGLE layout, loads with `eagle.load_draft`),
     plus eval.json (held-out agreement, eagle.train.evaluate) and training_summary.json.

Data parallel through accelerate: every process loads the target, collects its share of feature
shards, and trains on its slice of each global batch (--batch per process); gradients are averaged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from eagle.config import text_config
from eagle.files import save_atomic
from eagle.heads import DraftHead, Eagle1Head, Eagle3Head
from eagle.precision import resolve_dtype
from eagle.train.answering import LoopCap
from eagle.train.data import (
    FIELDS,
    TARGET_DISTS,
    FeatureBatch,
    FeatureStore,
    Sequences,
    chunk_tokens,
    collect_features,
    corpus_prompts,
    corpus_tokens,
    generate_sequences,
    hub_records,
    most_frequent_ids,
    pack_windows,
    read_jsonl,
    record_prompt,
    token_counts,
)
from eagle.train.ttt import ttt_loss

DATA_SPEC_KEYS = ("target", "tokenizer", "data_jsonl", "data_hub", "data_split", "seq_len", "max_tokens", "generate",
                  "prompt_len", "gen_temperature", "gen_limit", "gen_minutes", "gen_each", "loop_cap", "top_k",
                  "target_dist", "seed")
# Data directories written before a key existed were built with its then only value.
DATA_SPEC_DEFAULTS = {"target_dist": "topk", "gen_limit": None, "gen_minutes": None, "gen_each": False,
                      "loop_cap": False}
# Settings a run may change while its answers are still being generated (a limit keeps the answers written).
UNTIL_SEQUENCES_KEYS = ("gen_limit", "gen_minutes")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HF model directory or hub id of the target")
    ap.add_argument("--tokenizer", help="default: the target's")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", choices=("eagle3", "eagle1"), default="eagle3")
    ap.add_argument("--draft-vocab-size", type=int, default=32000, help="EAGLE-3 only; capped at the target's")
    ap.add_argument("--init", help="start from this draft checkpoint (its shape and draft vocabulary are kept)")
    ap.add_argument("--draft-shape", type=json.loads, default={},
                    help='JSON overrides of the head config, e.g. \'{"intermediate_size": 1024}\'')
    _add_data_arguments(ap.add_argument_group("data"))
    _add_training_arguments(ap.add_argument_group("training"))
    ev = ap.add_argument_group("evaluation of the final head")
    ev.add_argument("--eval-sequences", type=int, default=16, help="held-out windows scored at the end (0: skip)")
    ev.add_argument("--eval-jsonl", help="held-out texts (default: the stdlib held-out split with the stdlib corpus)")
    return ap.parse_args(argv)


def _add_data_arguments(data: argparse._ArgumentGroup) -> None:
    """The options of the training data: where it comes from, --generate's answers, the target's features."""
    data.add_argument("--data-jsonl", help="JSONL of {'text'} or chat records (default: the stdlib train split)")
    data.add_argument("--data-hub", help="a Hugging Face dataset of such records instead, ID[:CONFIG][@REVISION] "
                      "(ShareGPT 'conversations', UltraChat 'messages', or 'text'), read with `datasets`")
    data.add_argument("--data-split", default="train", help="its split (UltraChat-200k: train_sft)")
    data.add_argument("--data-dir", help="where sequences and features are kept (default: <out>/data)")
    data.add_argument("--seq-len", type=int, default=2048)
    data.add_argument("--max-tokens", type=int, help="use at most this many training tokens (default: all)")
    data.add_argument("--generate", action="store_true", help="train on the target's continuations of prompts")
    data.add_argument("--prompt-len", type=int, default=64, help="--generate from the corpus: prompt length")
    data.add_argument("--gen-temperature", type=float, nargs="+", default=[0.0],
                      help="--generate: 0 = greedy; several values split the prompts between them")
    data.add_argument("--gen-limit", type=int, nargs="+",
                      help="--generate: answer at most this many prompts per temperature (one value, or one per "
                           "--gen-temperature), the shortest first; default: every prompt")
    data.add_argument("--gen-minutes", type=float,
                      help="--generate: stop taking prompts after this wall time, split evenly between the "
                           "--gen-temperature values, and train on the answers written (a lent GPU's time limit)")
    data.add_argument("--gen-each", action="store_true",
                      help="--generate: answer every prompt at every --gen-temperature (default: split the prompts)")
    data.add_argument("--loop-cap", action="store_true",
                      help="--generate: end an answer once it repeats a block (eagle.train.answering.LoopCap)")
    data.add_argument("--gen-batch", type=int, default=16, help="--generate: rows decoding at once")
    data.add_argument("--top-k", type=int, default=32, help="target distribution kept as its top-k")
    data.add_argument("--target-dist", choices=TARGET_DISTS, default="topk",
                      help="topk: train on the renormalised top-k (soft cross-entropy); full: on the target's whole "
                      "temperature-1 distribution (forward KL), stored as its last hidden state")
    data.add_argument("--online", action="store_true", help="compute target features every step, store nothing")
    data.add_argument("--collect-batch", type=int, default=8, help="sequences per target forward")
    data.add_argument("--shard-size", type=int, default=64, help="sequences per feature shard")


def _add_training_arguments(train: argparse._ArgumentGroup) -> None:
    """The options of the training loop: schedule, unroll, precision, checkpoints and logging."""
    train.add_argument("--batch", type=int, default=4, help="sequences per step per process")
    train.add_argument("--lr", type=float, default=3e-4)
    train.add_argument("--warmup", type=int, default=50)
    train.add_argument("--epochs", type=float, default=1.0)
    train.add_argument("--steps", type=int, help="schedule length in steps (overrides --epochs)")
    train.add_argument("--minutes", type=float, help="stop (checkpoint, save final) after this wall time")
    train.add_argument("--deadline", type=float, metavar="UNIX_SECONDS",
                       help="a wall-clock time (time.time()) by which the schedule must end with its learning rate "
                       "cooled: the schedule is shortened to the steps that fit at the measured step times "
                       "(a lent machine or a job's time limit; the head is saved uncooled only if even that misses)")
    train.add_argument("--stop-at", type=int, help="stop at this step without finishing the schedule; rerun resumes")
    train.add_argument("--ttt-steps", type=int, default=7)
    train.add_argument("--ttt-curriculum", metavar="STEPS:FRACTION",
                       help="unroll only STEPS draft steps for the first FRACTION of the schedule, --ttt-steps after "
                       "(e.g. 2:0.8): a short unroll costs less per step, the full one is learnt at the end")
    train.add_argument("--pack", action="store_true",
                       help="lay several sequences end to end in each window of --seq-len tokens (attention and loss "
                       "kept within a sequence), instead of one right-padded sequence per window")
    train.add_argument("--warm-start", action="store_true",
                       help="EAGLE-3: the head's lm_head starts as the target's output embedding rows of the draft "
                       "vocabulary, its final norm as the target's (instead of random and ones)")
    train.add_argument("--decay", type=float, default=0.8, help="loss weight of TTT step j is decay**j")
    train.add_argument("--grad-clip", type=float, default=0.5)
    train.add_argument("--target-dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto",
                       help="the precision the target is loaded in; auto: eagle.precision's choice for the device")
    train.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                       help="draft compute (bf16 autocast or float32); auto: eagle.precision's choice for the device")
    train.add_argument("--save-every", type=int, default=200)
    train.add_argument("--log-every", type=int, default=10)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--wandb", choices=("online", "offline", "off"),
                       help="default: online if WANDB_API_KEY is set, else offline")
    train.add_argument("--wandb-project", default="mars-spec-draft")


# --- model setup ------------------------------------------------------------------------------

def load_target(path: str, device: torch.device, dtype: str = "auto"):
    """The target in `dtype` ("auto": eagle.precision's rule for `device`; features are stored in bf16
    anyway), frozen, in eval mode."""
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype, device).dtype
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model


def build_head(kind: str, target, draft_vocab_size: int, shape: dict, init: str | None = None) -> DraftHead:
    """A fresh head for `target`, or the checkpoint `init` to continue from. EAGLE-3: the token
    embedding is the target's, copied and frozen."""
    if init is not None:
        from eagle.checkpoint import load_draft

        head = load_draft(init, target).float()
        if head.config.kind != kind:
            raise ValueError(f"--init {init} is an {head.config.kind} head but --kind is {kind}")
        # A fitted confidence temperature belongs to the weights it was fitted on; training changes them.
        head.config.confidence_temperature = 1.0
        if isinstance(head, Eagle3Head):
            head.embed_tokens.weight.requires_grad_(False)
        return head
    if kind == "eagle1":
        return Eagle1Head.for_target(target, **shape)
    tc = text_config(target.config)
    shape = dict(shape)
    if shape.get("hidden_size", tc.hidden_size) != tc.hidden_size:
        shape.setdefault("target_hidden_size", tc.hidden_size)
    head = Eagle3Head.for_target(target.config, min(draft_vocab_size, tc.vocab_size), **shape)
    embedding = target.get_input_embeddings().weight
    if head.config.hidden_size == embedding.shape[1]:  # otherwise it has to be learnt
        head.embed_tokens.weight.data.copy_(embedding.detach().float())
        head.embed_tokens.weight.requires_grad_(False)
    return head


class TTTObjective(nn.Module):
    """The head plus its TTT loss as one module, so that data-parallel wrappers see one forward."""

    def __init__(self, head: DraftHead, steps: int, decay: float, bf16: bool, target_lm_head: nn.Module | None = None):
        super().__init__()
        self.head = head
        self.steps, self.decay = steps, decay
        self.autocast = bf16
        # The target's lm_head, frozen, for batches that carry its last hidden state (--target-dist full).
        # A plain attribute, not a submodule: it is not trained and must not be wrapped by data parallelism.
        self.__dict__["target_lm_head"] = target_lm_head

    def forward(self, input_ids, loss_mask, features, topk_ids=None, topk_probs=None, last_hidden=None,
                doc_ids=None, *, steps: int | None = None):
        batch = FeatureBatch(input_ids, loss_mask, features, topk_ids, topk_probs, last_hidden, doc_ids)
        dtype = torch.bfloat16 if self.autocast else None
        with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            result = ttt_loss(self.head, batch, steps or self.steps, self.decay, compute_dtype=dtype,
                              target_lm_head=self.target_lm_head)
        return result.loss, result.steps


# --- data -------------------------------------------------------------------------------------

def data_spec(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in DATA_SPEC_KEYS}


def check_data_dir(data_dir: Path, spec: dict) -> None:
    """Refuse to mix data built with other settings into this run."""
    meta = data_dir / "meta.json"
    if meta.exists():
        old = {**DATA_SPEC_DEFAULTS, **json.loads(meta.read_text())}
        diff = {k: (old.get(k), v) for k, v in spec.items() if old.get(k) != v}
        if diff and set(diff) <= set(UNTIL_SEQUENCES_KEYS) and not (data_dir / "sequences.pt").exists():
            meta.write_text(json.dumps(spec, indent=2))
            diff = {}
        if diff:
            raise ValueError(f"{data_dir} holds data built with other settings {diff} (old, new): "
                             "pass another --data-dir or --out, or delete it")
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(spec, indent=2))


def training_records(args: argparse.Namespace) -> Iterator[dict] | None:
    """The records of --data-jsonl or --data-hub; None: the stdlib corpus."""
    if args.data_jsonl and args.data_hub:
        raise ValueError("give the training data once: --data-jsonl or --data-hub")
    if args.data_hub:
        return hub_records(args.data_hub, args.data_split)
    return read_jsonl(args.data_jsonl) if args.data_jsonl else None


def generation_prompts(args: argparse.Namespace, tokenizer, cache_dir: Path) -> list[list[int]]:
    count = args.max_tokens // args.seq_len if args.max_tokens else None
    records = training_records(args)
    if records is not None:
        prompts = [record_prompt(r, tokenizer) for r in records]
        return prompts[:count] if count else prompts
    if not count:
        raise ValueError("--generate from the stdlib corpus needs --max-tokens (how much to generate)")
    return corpus_prompts(corpus_tokens(tokenizer, None, "train", cache_dir), count, args.prompt_len, args.seed)


def generation_limits(gen_limit: list[int] | None, temperatures: int, world: int) -> list[int | None]:
    """--gen-limit as one cap per temperature for one of `world` processes (each answers its share)."""
    if gen_limit is None:
        return [None] * temperatures
    if len(gen_limit) not in (1, temperatures):
        raise ValueError(f"--gen-limit takes one value or one per --gen-temperature ({temperatures}), "
                         f"got {len(gen_limit)}")
    return [-(-n // world) for n in (gen_limit * temperatures if len(gen_limit) == 1 else gen_limit)]


def prepare_sequences(args, target, tokenizer, data_dir: Path, accelerator, log) -> Sequences:
    """Build (once) and load the training sequences; generation is split across processes."""
    path = data_dir / "sequences.pt"
    if not path.exists():
        if args.generate:
            rank, world = accelerator.process_index, accelerator.num_processes
            prompts = generation_prompts(args, tokenizer, data_dir)[rank::world]
            temperatures = args.gen_temperature
            limits = generation_limits(args.gen_limit, len(temperatures), world)
            loop_cap = LoopCap() if args.loop_cap else None
            part = Sequences.concat([
                generate_sequences(target, tokenizer, prompts if args.gen_each else prompts[i :: len(temperatures)],
                                   args.seq_len, batch_size=args.gen_batch, temperature=t,
                                   seed=args.seed + rank * len(temperatures) + i, log=log,
                                   progress=data_dir / f"generating.rank{rank}.part{i}.pt", limit=limits[i],
                                   loop_cap=loop_cap,
                                   seconds=args.gen_minutes * 60 / len(temperatures) if args.gen_minutes else None)
                for i, t in enumerate(temperatures)])
            part.save(data_dir / f"sequences.rank{rank}.pt")
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                parts = [Sequences.load(data_dir / f"sequences.rank{r}.pt") for r in range(world)]
                Sequences.concat(parts).save(path)
        elif accelerator.is_main_process:
            tokens = corpus_tokens(tokenizer, training_records(args), "train", data_dir)
            count = args.max_tokens // args.seq_len if args.max_tokens else None
            chunk_tokens(tokens, args.seq_len, count, args.seed).save(path)
        accelerator.wait_for_everyone()
    return Sequences.load(path)


def warm_start(head: Eagle3Head, target) -> None:
    """The head's output layer and final norm as the target's own for the draft vocabulary: its lm_head rows
    of those words (a tied target's token embedding) and its final norm. The head's last hidden state then
    reads like the target's last one from the first step, instead of through a random map."""
    norm = getattr(target.get_decoder(), "norm", None)
    if norm is None or norm.weight.shape != head.norm.weight.shape:
        raise ValueError("--warm-start needs a target whose decoder has a final `norm` of the head's hidden size")
    rows = head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=head.d2t.device))
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[rows.to(head.lm_head.weight.device)].float())
        head.norm.weight.copy_(norm.weight.float())


def ttt_depth(step: int, total: int, steps: int, curriculum: str | None) -> int:
    """Draft steps unrolled at training step `step`: the curriculum's short unroll for its first fraction
    of the schedule, then `steps`."""
    if not curriculum:
        return steps
    short, _, fraction = curriculum.partition(":")
    if not fraction or int(short) < 1 or not 0 <= float(fraction) <= 1:
        raise ValueError(f"--ttt-curriculum takes STEPS:FRACTION, e.g. 2:0.8, not {curriculum!r}")
    return int(short) if step < float(fraction) * total else steps


class PackedEpochs:
    """Windows of packed sequences (`pack_windows`), a fresh seeded shuffle each epoch; `batch(step)` is the
    global batch of windows at a step, so resuming at a step is exact. Every epoch has the steps of the
    first one (a later shuffle may pack into a window more or fewer; the surplus is dropped, a shortfall
    wraps around)."""

    def __init__(self, lengths: torch.Tensor, width: int, global_batch: int, seed: int):
        self.lengths, self.width, self.global_batch, self.seed = lengths, width, global_batch, seed
        self._plans: dict[int, list[list[int]]] = {}
        self.steps_per_epoch = len(self.plan(0)) // global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(lengths)} sequences pack into fewer windows than one global batch of "
                             f"{global_batch}")

    def plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(len(self.lengths), generator=generator).tolist()
            self._plans = {epoch: pack_windows(order, self.lengths, self.width)}  # one epoch kept at a time
        return self._plans[epoch]

    def batch(self, step: int) -> list[list[int]]:
        epoch, k = divmod(step, self.steps_per_epoch)
        plan = self.plan(epoch)
        return [plan[i % len(plan)] for i in range(k * self.global_batch, (k + 1) * self.global_batch)]


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak learning rate: linear warmup, then cosine decay to 10% at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def batch_indices(step: int, num_sequences: int, global_batch: int, seed: int) -> torch.Tensor:
    """Sequence indices of a global batch: a fresh seeded permutation per epoch, so resuming at a step is exact."""
    per_epoch = num_sequences // global_batch
    if per_epoch == 0:
        raise ValueError(f"{num_sequences} training sequences are fewer than one global batch of {global_batch}")
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(num_sequences, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return perm[k * global_batch : (k + 1) * global_batch]


# --- logging ----------------------------------------------------------------------------------

def init_wandb(args: argparse.Namespace, out: Path, is_main: bool):
    mode = args.wandb or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    if mode == "off" or not is_main:
        return None
    import wandb

    id_file = out / "wandb_run_id"
    if not id_file.exists():
        id_file.write_text(secrets.token_hex(4))  # kept, so that a resumed run continues the same W&B run
    return wandb.init(project=args.wandb_project, dir=str(out), mode=mode, id=id_file.read_text().strip(),
                      resume="allow", config=vars(args))


def step_metrics(loss: torch.Tensor, stats, lr: float) -> dict:
    metrics = {"loss": float(loss.detach()), "lr": lr}
    for j, s in enumerate(stats):
        metrics[f"acc_{j}"] = s.correct / max(s.count, 1)
        metrics[f"loss_{j}"] = s.loss / max(s.count, 1)
    return metrics


# --- training ---------------------------------------------------------------------------------

@dataclass
class Counters:
    """What a run has spent, kept across resumes: positions that carried a loss at draft step 1 (the TTT
    unroll's first step; each is also trained at the deeper steps the unroll reaches), this process's CPU
    seconds (all its threads) and wall seconds in training steps."""

    loss_positions: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def save_checkpoint(path: Path, head: DraftHead, optimizer, scheduler, step: int,
                    counters: Counters | None = None) -> None:
    save_atomic({
        "head": head.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "step": step, "config": head.config.to_json(), "counters": (counters or Counters()).as_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
    }, path)


def write_progress(out: Path, step: int, total: int, counters: Counters) -> None:
    """<out>/progress.json: where the schedule stands at the last checkpoint (read by `eagle.train.status`)."""
    (out / "progress.json").write_text(json.dumps({"step": step, "schedule_steps": total, **counters.as_dict()}))


def load_checkpoint(path: Path, head: DraftHead, optimizer, scheduler, counters: Counters | None = None) -> int:
    """Restore a run (and its `counters`, where the checkpoint has them); returns its step."""
    state = torch.load(path, weights_only=False, map_location="cpu")
    if state["config"] != head.config.to_json():
        raise ValueError(f"{path} belongs to a head of another shape or target; use another --out")
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    if counters is not None:
        for name, value in state.get("counters", {}).items():
            setattr(counters, name, value)
    return state["step"]


def schedule_length(args: argparse.Namespace, num_sequences: int, global_batch: int) -> int:
    if args.steps:
        return args.steps
    return max(1, int(args.epochs * (num_sequences // global_batch)))


class StepClock:
    """Wall seconds per training step at each unroll depth, as measured (what fits a schedule to a deadline).

    A depth not yet timed (the curriculum's full unroll, before it starts) is estimated from the nearest timed
    one in proportion to the unrolled steps, times `margin`: a longer unroll cost more than in proportion on
    the 2-core EPYC (3.1x from depth 2 to 5, the model card's recipe table), and a late estimate only shortens."""

    def __init__(self, margin: float = 1.3):
        self.margin = margin
        self.timed: dict[int, tuple[float, int]] = {}  # depth -> (seconds, steps)

    def record(self, depth: int, seconds: float) -> None:
        total, count = self.timed.get(depth, (0.0, 0))
        self.timed[depth] = (total + seconds, count + 1)

    def seconds(self, depth: int) -> float:
        if depth in self.timed:
            total, count = self.timed[depth]
            return total / count
        near = min(self.timed, key=lambda d: (abs(d - depth), d))
        return self.seconds(near) * depth / near * (self.margin if depth > near else 1.0)


def fit_schedule(step: int, total: int, seconds_left: float, clock: StepClock,
                 depth_at: Callable[[int, int], int]) -> int:
    """The longest schedule of at most `total` steps whose steps from `step` on fit in `seconds_left` at the
    clock's step times; `depth_at(s, length)` is step s's unroll in a schedule of that length (the curriculum's
    switch moves with the length). At least step + 1: a schedule ends after the step in hand."""

    def cost(length: int) -> float:
        return sum(clock.seconds(depth_at(s, length)) for s in range(step, length))

    # No schedule longer than the cheapest step allows can fit (its cost is above seconds_left), so the search
    # stops there: summing a long schedule (a --steps of 10^6 cut to a deadline) took seconds of pure Python,
    # under load enough to overrun the deadline being fitted to.
    cheapest = min(clock.seconds(d) for d in range(1, max(clock.timed) + 1)) if clock.timed else 0.0
    top = min(total, step + int(max(seconds_left, 0.0) / cheapest) + 1) if cheapest > 0 else total
    if top == total and cost(total) <= seconds_left:
        return total
    low, high = step + 1, top - 1  # cost grows with the length: each added step costs more than the switch saves
    while low < high:
        mid = (low + high + 1) // 2
        if cost(mid) <= seconds_left:
            low = mid
        else:
            high = mid - 1
    return low


def train(argv: list[str] | None = None) -> DraftHead:
    """Run the whole pipeline (see the module doc); returns the trained head."""
    from accelerate import Accelerator

    args = parse_args(argv)
    accelerator = Accelerator()
    log = accelerator.print
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data_dir or out / "data")
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    target, tokenizer, seqs = _target_and_sequences(args, accelerator, data_dir, log)
    head = _initial_head(args, target, seqs, log)
    head.to(accelerator.device)
    store = _feature_store(args, accelerator, target, head, seqs, data_dir, log)
    training = _Training(args, accelerator, log, out=out, target=target, head=head, seqs=seqs, store=store)
    training.loop()
    if accelerator.is_main_process:
        training.save()
        finish(args, head, target, tokenizer, out, data_dir, step=training.step, total=training.total,
               counters=training.counters, loss_positions_per_s=training.rate(), log=log)
    accelerator.wait_for_everyone()
    training.close()
    return head


def _target_and_sequences(args: argparse.Namespace, accelerator, data_dir: Path, log) -> tuple:
    """The target, its tokenizer and the training sequences (stage 1, built once: a rerun loads them)."""
    from transformers import AutoTokenizer

    target = load_target(args.target, accelerator.device, args.target_dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.target)
    if accelerator.is_main_process:
        check_data_dir(data_dir, data_spec(args))
    accelerator.wait_for_everyone()
    seqs = prepare_sequences(args, target, tokenizer, data_dir, accelerator, log)
    log(f"{len(seqs)} training sequences, {seqs.num_tokens():,} trained positions")
    return target, tokenizer, seqs


def _initial_head(args: argparse.Namespace, target, seqs: Sequences, log) -> DraftHead:
    """The head training starts from: --init's, or a fresh one with the draft vocabulary of the sequences' most
    frequent next tokens (stage 2), --warm-start's output layer where asked."""
    head = build_head(args.kind, target, args.draft_vocab_size, args.draft_shape, args.init)
    if args.init is None and isinstance(head, Eagle3Head) and head.config.draft_vocab_size < head.config.vocab_size:
        counts = token_counts(seqs, head.config.vocab_size)
        head.set_draft_vocab(most_frequent_ids(counts, head.config.draft_vocab_size))
        coverage = counts[head.t2d].sum() / counts.sum().clamp_min(1)
        log(f"draft vocabulary {head.config.draft_vocab_size} covers {coverage:.1%} of training next tokens")
    if args.warm_start:
        if args.init is not None or not isinstance(head, Eagle3Head):
            raise ValueError("--warm-start starts a fresh EAGLE-3 head; it cannot be combined with --init or --kind "
                             "eagle1")
        warm_start(head, target)
        log("warm start: lm_head and final norm from the target's")
    return head


def _feature_store(args: argparse.Namespace, accelerator, target, head: DraftHead, seqs: Sequences, data_dir: Path,
                   log) -> FeatureStore:
    """The target's features (stage 3), collected once unless --online, and held on the GPU where they fit."""
    store = FeatureStore(data_dir, seqs, args.shard_size)
    if not args.online and store.missing():
        hidden_bytes = target.get_output_embeddings().weight.shape[1] * next(target.parameters()).element_size()
        per_token = 2 * head.config.feature_size + (hidden_bytes if args.target_dist == "full" else 4 * args.top_k)
        log(f"collecting target features: ~{per_token * seqs.lengths.sum() / 1e9:.2f} GB in {data_dir}")
        store.build(target, head.config.feature_layers, args.top_k, args.collect_batch,
                    rank=accelerator.process_index, world=accelerator.num_processes, log=log,
                    target_dist=args.target_dist)
    accelerator.wait_for_everyone()
    if accelerator.device.type == "cuda" and not args.online:
        # Answering and feature collection leave blocks in PyTorch's cache, which the driver counts as used: on an
        # H100 after answering in 2,048 rows, 14 GB of 80 read as free and 14 GB of features stayed on the host
        # (training ran at 35k loss positions/s, against 110k in an earlier build). Hand them back before asking.
        torch.cuda.empty_cache()
        need, free = store.nbytes(), torch.cuda.mem_get_info(accelerator.device)[0]
        if need < free // 2:  # half the free memory at most: training's activations need the rest
            store.preload(accelerator.device)
            log(f"features: {need / 1e9:.2f} GB held on {accelerator.device}")
        else:
            log(f"features stay on the host ({need / 1e9:.2f} GB, {free / 1e9:.2f} GB free on {accelerator.device})")
    return store


def _packing(args: argparse.Namespace, seqs: Sequences, global_batch: int, log) -> PackedEpochs | None:
    """--pack's epochs of packed windows (None without it: one right-padded sequence per window)."""
    packed = PackedEpochs(seqs.lengths, seqs.seq_len, global_batch, args.seed) if args.pack else None
    if packed is not None:
        if args.online:
            raise ValueError("--pack reads stored features; it cannot be combined with --online")
        log(f"packing: {len(packed.plan(0))} windows of {seqs.seq_len} tokens for {len(seqs)} sequences")
    return packed


def _objective(args: argparse.Namespace, accelerator, target, head: DraftHead, log) -> TTTObjective:
    """The head and its TTT loss in the draft's compute precision (bf16 autocast or float32), both logged."""
    bf16 = args.precision == "bf16" or (args.precision == "auto" and
                                        resolve_dtype("auto", accelerator.device).dtype == torch.bfloat16)
    log(f"draft compute: {'bf16 autocast' if bf16 else 'float32'}")
    log(f"loss: {'forward KL to the full' if args.target_dist == 'full' else 'soft cross-entropy to the top-k'} "
        "target distribution")
    return TTTObjective(head, args.ttt_steps, args.decay, bf16,
                        target.get_output_embeddings() if args.target_dist == "full" else None)


class _Training:
    """The training loop of one run (stage 4) and what it advances: the step, the schedule's length (--deadline
    shortens it, and the learning rate follows), the counters, and the marks its rates are measured from."""

    def __init__(self, args: argparse.Namespace, accelerator, log, *, out: Path, target, head: DraftHead,
                 seqs: Sequences, store: FeatureStore):
        self.args, self.accelerator, self.log, self.out = args, accelerator, log, out
        self.target, self.head, self.seqs, self.store = target, head, seqs, store
        self.global_batch = args.batch * accelerator.num_processes
        self.packed = _packing(args, seqs, self.global_batch, log)
        self.total = schedule_length(args, self.packed.steps_per_epoch * self.global_batch if self.packed
                                     else len(seqs), self.global_batch)
        self.params = [p for p in head.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self.params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        # A plain function reading `self.total` at each step: a deadline that shortens the schedule cools the rate
        # sooner (and a function, unlike a bound method, stays out of the scheduler's state_dict).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, self.total, args.warmup))
        self.ckpt = out / "checkpoint.pt"
        self.counters = Counters()
        self.step = load_checkpoint(self.ckpt, head, optimizer, self.scheduler, self.counters) \
            if self.ckpt.exists() else 0
        if self.step:
            log(f"resumed from step {self.step}")
        self.model, self.optimizer = accelerator.prepare(_objective(args, accelerator, target, head, log), optimizer)
        self.wandb = init_wandb(args, out, accelerator.is_main_process)
        self.history = open(out / "train_log.jsonl", "a") if accelerator.is_main_process else None
        self.rank_slice = slice(accelerator.process_index * args.batch, (accelerator.process_index + 1) * args.batch)
        self.t0 = self.t_log = time.time()
        self.cpu_mark, self.wall_mark = time.process_time(), time.time()
        self.start_step = self.step
        self.positions_at_start = self.positions_at_log = self.counters.loss_positions

    def loop(self) -> None:
        """Train until the schedule ends, --stop-at, --minutes or --deadline (process 0's clock decides)."""
        args, accelerator = self.args, self.accelerator
        clock = StepClock()
        self.model.train()
        while self.step < self.total and self.step != args.stop_at:
            lap = time.time()  # the whole iteration, checkpoints and logs included, is what a deadline must fit
            batch = self.batch()
            depth = ttt_depth(self.step, self.total, args.ttt_steps, args.ttt_curriculum)
            metrics = self.optimise(batch, depth)
            self.report(metrics, depth)
            if self.step % args.save_every == 0 and accelerator.is_main_process:
                self.save()
            if args.minutes is not None and out_of_time(accelerator, self.t0 + args.minutes * 60):
                break
            if args.deadline is not None:
                self.total = deadline_schedule(accelerator, args, self.step, self.start_step, self.total, depth=depth,
                                               seconds=time.time() - lap, clock=clock, log=self.log)
                if out_of_time(accelerator, args.deadline):  # past it even so: saved as it stands, uncooled
                    break

    def batch(self) -> FeatureBatch:
        """This process's slice of the step's global batch: packed windows, stored features, or (--online) features
        the target computes now."""
        args, seqs = self.args, self.seqs
        if self.packed is not None:
            return self.store.packed(self.packed.batch(self.step)[self.rank_slice], seqs.seq_len)
        indices = batch_indices(self.step, len(seqs), self.global_batch, args.seed)[self.rank_slice]
        return self.store.batch(indices) if not args.online else \
            collect_features(self.target, seqs.select(indices), self.head.config.feature_layers, args.top_k,
                             args.target_dist)

    def optimise(self, batch: FeatureBatch, depth: int) -> dict:
        """One optimiser step on `batch` at unroll `depth`, its loss positions and CPU and wall time counted;
        returns the step's metrics (sent to W&B)."""
        accelerator, counters = self.accelerator, self.counters
        loss, stats = self.model(**{name: getattr(batch.to(accelerator.device), name) for name in FIELDS}, steps=depth)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(self.params, self.args.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        counters.loss_positions += int(accelerator.reduce(torch.tensor(stats[0].count, device=accelerator.device),
                                                          "sum"))
        counters.cpu_seconds += time.process_time() - self.cpu_mark
        counters.wall_seconds += time.time() - self.wall_mark
        self.cpu_mark, self.wall_mark = time.process_time(), time.time()
        metrics = step_metrics(loss, stats, self.scheduler.get_last_lr()[0])
        if self.wandb is not None:
            self.wandb.log(metrics, step=self.step)
        return metrics

    def report(self, metrics: dict, depth: int) -> None:
        """Every --log-every steps and at the last: the step's figures in the log and in train_log.jsonl."""
        step, counters = self.step, self.counters
        if not (step % self.args.log_every == 0 or step == self.total):
            return
        rate = (counters.loss_positions - self.positions_at_log) / (time.time() - self.t_log)
        self.t_log, self.positions_at_log = time.time(), counters.loss_positions
        accs = " ".join(f"{metrics[f'acc_{j}']:.2f}" for j in range(depth))
        self.log(f"step {step}/{self.total} loss {metrics['loss']:.3f} acc {accs} lr {metrics['lr']:.2e} "
                 f"loss positions/s {rate:.0f}")
        if self.history:
            self.history.write(json.dumps({"step": step, **metrics, "ttt_depth": depth, **counters.as_dict(),
                                           "loss_positions_per_s": rate}) + "\n")
            self.history.flush()

    def save(self) -> None:
        """The checkpoint a rerun resumes from, and progress.json beside it (`eagle.train.status` reads it)."""
        save_checkpoint(self.ckpt, self.head, self.optimizer, self.scheduler, self.step, self.counters)
        write_progress(self.out, self.step, self.total, self.counters)

    def rate(self) -> float:
        """This run's loss positions per second of wall time since the loop started (0 where it trained no step)."""
        return (self.step - self.start_step) and \
            (self.counters.loss_positions - self.positions_at_start) / max(time.time() - self.t0, 1e-9)

    def close(self) -> None:
        """Close train_log.jsonl and end the W&B run."""
        if self.history:
            self.history.close()
        if self.wandb is not None:
            self.wandb.finish()


def deadline_schedule(accelerator, args, step: int, start_step: int, total: int, *, depth: int, seconds: float,
                      clock: StepClock, log) -> int:
    """The schedule's length after training step `step` took `seconds`: unchanged until 20 steps are timed
    (the first 5 after a start are left out: allocator and kernel warm-up), then every 20 steps shortened, never
    lengthened, to what fits before --deadline (`fit_schedule`). Process 0's length is every process's, so that
    all of them leave the loop at the same step."""
    done = step - start_step
    if done > 5:
        clock.record(depth, seconds)
    if done < 25 or done % 20:
        return total
    fitted = fit_schedule(step, total, args.deadline - time.time(), clock,
                          lambda s, length: ttt_depth(s, length, args.ttt_steps, args.ttt_curriculum))
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast

        fitted = int(broadcast(torch.tensor([fitted], device=accelerator.device), from_process=0).item())
    if fitted < total:
        log(f"schedule fitted to the deadline: {fitted} steps instead of {total} "
            f"({', '.join(f'depth {d}: {clock.seconds(d):.3f} s' for d in sorted(clock.timed))} a step)")
    return fitted


def out_of_time(accelerator, end: float) -> bool:
    """Whether the wall clock has passed `end` (time.time() seconds: --minutes after the start, or --deadline),
    decided by process 0 so that all processes stop together."""
    flag = torch.tensor([float(time.time() > end)], device=accelerator.device)
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast

        flag = broadcast(flag, from_process=0)
    return bool(flag.item())


def finish(args, head: DraftHead, target, tokenizer, out: Path, data_dir: Path, *, step: int, total: int,
           counters: Counters, loss_positions_per_s: float, log) -> None:
    """Save the public-layout head, then score it on held-out data as it will be loaded for decoding."""
    from eagle.checkpoint import load_draft, save_draft
    from eagle.train.evaluate import run_evaluation

    final = out / "final"
    save_draft(head, final)
    summary = {"step": step, "schedule_steps": total, "deadline": args.deadline,
               "loss_positions_per_s_this_run": loss_positions_per_s,
               **counters.as_dict(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "kind": args.kind, "ttt_steps": args.ttt_steps, "ttt_curriculum": args.ttt_curriculum,
               "pack": args.pack, "warm_start": args.warm_start, "seq_len": args.seq_len, "batch": args.batch,
               "lr": args.lr, "target": args.target, "init": args.init, "generate": args.generate,
               "gen_temperature": args.gen_temperature if args.generate else None,
               "gen_limit": args.gen_limit if args.generate else None, "target_dist": args.target_dist,
               "loss": "forward KL, full distribution" if args.target_dist == "full" else "soft CE, top-k"}
    (final / "training_summary.json").write_text(json.dumps(summary, indent=2))
    if args.eval_sequences and (args.eval_jsonl or not (args.data_jsonl or args.data_hub)):
        report = run_evaluation(target, load_draft(final, target), tokenizer, args.eval_jsonl, args.seq_len,
                                args.eval_sequences, max(args.ttt_steps, 1), data_dir)
        (final / "eval.json").write_text(json.dumps(report, indent=2))
        log(f"held-out: first-token acc {report['first_token_acc']:.3f}, "
            f"top-10 {report['first_token_top10_acc']:.3f}, chain length ~{report['chain_accept_length_estimate']:.2f}")


def main(argv: list[str] | None = None) -> None:
    train(argv)


if __name__ == "__main__":
    main()
