"""Fit a draft head's confidence temperature (`DraftConfig.confidence_temperature`, `eagle.tree.confidence_logprobs`).

EAGLE-2 keeps the tree candidates of highest cumulative draft probability, on the premise that the
head's probability of a candidate tracks the chance that the target accepts it. Greedily a candidate
is accepted (its parent reached) exactly when it is the target's argmax, so the premise can be checked
and repaired on the target's own greedy continuations of prompts, teacher-forced along the head's
TTT unroll (`eagle.train.ttt.ttt_unroll`: draft step j reads the head's own output of step j - 1, as
tree drafting does). Every one of the head's top-k candidates at every position and step is an event:
confidence c_T = softmax(logits / T)[candidate], outcome y = 1[candidate is the target's argmax]. The
fitted T minimises the binary cross-entropy of c_T against y over all events (temperature scaling, the
one-parameter calibration of classifiers, applied to acceptance), searched on a log grid. T only
changes which nodes a tree keeps, never what verification accepts.

Fit it on prompts of the *train* split (`python -m eval.prompts --split train`), never on the
benchmark's held-out prompts. The fit is reported per step (top-1 acceptance against the mean top-1
confidence before and after); `--write` stores T in the head's config.json.

    python -m eval.prompts --split train --count 256 --per-file 100 --out runs/confidence_prompts.jsonl
    python -m eagle.train.confidence --target data/models/target --draft data/models/draft \\
        --prompts runs/confidence_prompts.jsonl --dtype float32 --out runs/confidence.json [--write]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from compute.kernels import packed_where_chosen
from eagle.files import write_atomic
from eagle.heads import DraftHead
from eagle.train.data import Sequences, collect_features
from eagle.train.evaluate import continuation_data, load_pair, pair_arguments
from eagle.train.ttt import shift_left, ttt_unroll

# Temperatures searched: log-spaced, each 5% above the last.
GRID = torch.exp(torch.linspace(math.log(0.05), math.log(4.0), 91))


FLOOR = -87.0  # exp(-87) = 1.6e-38, float32's smallest normal numbers
BLOCK = 128  # positions per block of `log_partitions`: [128, 8192] float32 is 4 MiB, near a core's L2 + L3 share


def log_partitions(shifted: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """log sum_v exp(shifted[n, v] / T) for every grid temperature T: [G, N, 1] from shifted [N, V] (logits less
    their row's max) and temperatures [G]. The same sums as a logsumexp per temperature, taken block by block of
    BLOCK positions so that a block's G passes read memory once: one logsumexp of the whole [N, V] per temperature
    (91 of them) was 80% of a 32-sequence fit on a 2-core EPYC."""
    out = shifted.new_empty(temperatures.shape[0], shifted.shape[0])
    scratch = shifted.new_empty(min(BLOCK, shifted.shape[0]), shifted.shape[1])
    for start in range(0, shifted.shape[0], BLOCK):
        block = shifted[start : start + BLOCK]
        work = scratch[: block.shape[0]]
        for g, t in enumerate(temperatures.tolist()):
            torch.div(block, t, out=work)
            # Floored at FLOOR: exp below float32's normal range took 15x as long (a slow path on a Zen 3); a term
            # that small (< 1.2e-38) adds nothing to a sum holding exp(0) = 1, so the sums are unchanged.
            out[g, start : start + block.shape[0]] = work.clamp_min_(FLOOR).exp_().sum(-1)
    return out.log_()[:, :, None]


@dataclass
class Calibration:
    """Sums over the events of a fit (add batches, then `result`)."""

    temperatures: torch.Tensor  # [G] the grid
    bce: torch.Tensor  # [G] summed binary cross-entropy per grid temperature
    events: int = 0
    # per step: positions, top-1 accepted, summed top-1 confidence per grid temperature [G]
    positions: list[int] = field(default_factory=list)
    top1_accepted: list[int] = field(default_factory=list)
    top1_confidence: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def empty(cls, steps: int, temperatures: torch.Tensor = GRID) -> Calibration:
        g = temperatures.shape[0]
        return cls(temperatures, torch.zeros(g, dtype=torch.float64), 0, [0] * steps, [0] * steps,
                   [torch.zeros(g, dtype=torch.float64) for _ in range(steps)])

    def add(self, step: int, logits: torch.Tensor, argmax: torch.Tensor, valid: torch.Tensor, head: DraftHead,
            topk: int) -> None:
        """Events of one step: logits [N, V_d] the head's at N positions, argmax [N] the target's token
        (target ids) there, valid [N] bool."""
        logits, argmax = logits[valid].float(), argmax[valid]
        if logits.shape[0] == 0:
            return
        values, ids = logits.topk(min(topk, logits.shape[-1]), dim=-1)  # [N, k], values[:, 0] the row's max
        hit = head.to_target_ids(ids) == argmax[:, None]  # [N, k]
        temperatures = self.temperatures.to(logits.dtype)[:, None, None]  # [G, 1, 1]
        # log c_T = z / T - logsumexp(logits / T), taken from the row's max (z - max <= 0: nothing overflows)
        log_c = (values - values[:, :1]) / temperatures - log_partitions(logits - values[:, :1], self.temperatures)
        log_not = torch.log1p(-log_c.exp().clamp(max=1 - 1e-7))  # [G, N, k]
        self.bce -= torch.where(hit, log_c, log_not).sum((1, 2)).double()
        self.top1_confidence[step] += log_c[:, :, 0].exp().sum(1).double()
        self.events += hit.numel()
        self.positions[step] += logits.shape[0]
        self.top1_accepted[step] += int(hit[:, 0].sum())

    def result(self) -> dict:
        """The fitted temperature (the grid's BCE minimum) and the per-step calibration at 1.0 and at it."""
        if not self.events:
            raise ValueError("no events to fit: the sequences have no scored positions (empty continuations?)")
        best = int(self.bce.argmin())
        one = int((self.temperatures - 1.0).abs().argmin())
        steps = []
        for j, n in enumerate(self.positions):
            if n:
                steps.append({"step": j, "positions": n, "top1_acceptance": self.top1_accepted[j] / n,
                              "top1_confidence_at_1": float(self.top1_confidence[j][one] / n),
                              "top1_confidence_fitted": float(self.top1_confidence[j][best] / n)})
        return {"confidence_temperature": round(float(self.temperatures[best]), 4), "events": self.events,
                "bce_per_event_at_1": float(self.bce[one] / self.events),
                "bce_per_event_fitted": float(self.bce[best] / self.events), "steps": steps,
                "grid": [round(float(t), 4) for t in self.temperatures]}


@torch.no_grad()
def fit_confidence(head: DraftHead, target_model, seqs: Sequences, steps: int = 5, topk: int = 10,
                   batch_size: int = 8, temperatures: torch.Tensor = GRID) -> dict:
    """Fit the head's confidence temperature on `seqs`, the target's own greedy continuations (module doc)."""
    fit = Calibration.empty(steps, temperatures)
    for start in range(0, len(seqs), batch_size):
        rows = torch.arange(start, min(start + batch_size, len(seqs)))
        with packed_where_chosen(target_model):  # the target's forwards on packed weights, as FeatureStore.build's
            batch = collect_features(target_model, seqs.select(rows), head.config.feature_layers, top_k=1)
        batch = batch.to(head.device)
        length = batch.input_ids.shape[1] - 1
        for j, out in enumerate(ttt_unroll(head, batch.features, batch.input_ids, steps)):
            # Step j at draft position i predicts the target's token after position i + j + 1.
            argmax = shift_left(batch.topk_ids[..., 0], j + 1)[:, :length]
            valid = shift_left(batch.loss_mask, j + 1)[:, :length]
            fit.add(j, head.logits(out).flatten(0, 1), argmax.flatten(), valid.flatten(), head, topk)
    return fit.result()


def write_temperature(draft_dir: Path, temperature: float) -> None:
    """Set `confidence_temperature` in the head's config.json (atomically: a reader never sees half a file)."""
    path = draft_dir / "config.json"
    config = json.loads(path.read_text())
    config["confidence_temperature"] = temperature
    write_atomic(path, json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_arguments(ap)
    ap.add_argument("--prompts", required=True, help="a JSONL of train-split prompts the target continues greedily")
    ap.add_argument("--sequences", type=int, default=256, help="prompts to continue")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="draft steps (tree depth) whose candidates are events")
    ap.add_argument("--topk", type=int, default=10, help="candidates per position (the tree's branching)")
    ap.add_argument("--sequences-cache", help="keep the continuations in this file and reuse them when it exists")
    ap.add_argument("--out", help="also write the report to this JSON file")
    ap.add_argument("--write", action="store_true", help="store the fitted temperature in the draft's config.json")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.topk < 1:
        raise SystemExit(f"--steps and --topk must be >= 1, got {args.steps} and {args.topk}")
    target, tokenizer, head, _ = load_pair(args)
    cache = Path(args.sequences_cache) if args.sequences_cache else None
    if cache is not None and cache.exists():
        seqs = Sequences.load(cache)
    else:
        seqs = continuation_data(target, tokenizer, args.prompts, args.seq_len, args.sequences, temperature=0.0)
        if cache is not None:
            seqs.save(cache)
    report = fit_confidence(head, target, seqs, args.steps, args.topk)
    report["data"] = {"prompts": args.prompts, "count": len(seqs), "seq_len": args.seq_len, "dtype": str(target.dtype),
                      "previous_confidence_temperature": head.config.confidence_temperature}
    print(json.dumps({k: v for k, v in report.items() if k != "grid"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.write:
        temperature = report["confidence_temperature"]
        write_temperature(Path(args.draft), temperature)
        print(f"wrote confidence_temperature={temperature} into {Path(args.draft) / 'config.json'}")


if __name__ == "__main__":
    main()
