"""Training-time test (TTT): unroll the draft head on its own outputs, as tree drafting does, and score each step.

Step 0 at draft position i reads (target feature at i, token i + 1) and predicts token i + 2, the
target's distribution at position i + 1. Step j > 0 reads (the head's own output of step j - 1 at
position i, token i + j + 1) and predicts token i + j + 2. This is `DraftHead.propose` along one
branch: the step-j query sits at rotary position i + j and sees the step-0 keys at positions <= i
(the committed prefix), the keys of steps 1..j - 1 at the same i (its ancestors) and itself. The
ancestors of one position are on the diagonal of each earlier step's block, so all positions of a
step run as one batch with the mask built by `ttt_attention_mask`.

Loss at step j, weighted decay**j: EAGLE-3, soft cross-entropy between the head's distribution over
the draft vocabulary and the target's (top-k) distribution restricted to it and renormalised;
EAGLE-1, smooth-L1 regression of the next target feature + 0.1 x cross-entropy through the target's
lm_head. Positions whose inputs run off the sequence end are masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from eagle.heads import DraftHead, Eagle3Head
from eagle.train.data import FeatureBatch


def ttt_attention_mask(length: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool mask [length, (step + 1) * length] for the queries of TTT step `step` (True = attend).

    Key blocks, in order: step 0 (causal: position i sees <= i), then steps 1..step (diagonal:
    position i sees only itself, its own ancestor at that step or itself at the last block).
    """
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * step, dim=1)


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, i + n] at row i along dim 1, zero-filled past the end (same shape as x)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat([x[:, n:], pad], dim=1)


def layer_step(head: DraftHead, embeds, hidden, cos, sin, mask, past):
    """One pass of the head's decoder layer with explicit past keys; returns (out, k, v)."""
    if isinstance(head, Eagle3Head):
        return head.midlayer(embeds, hidden, cos, sin, mask, past=past)
    return head.layers[0](head.fc(torch.cat([embeds, hidden], dim=-1)), cos, sin, mask, past=past)


def ttt_unroll(head: DraftHead, features: torch.Tensor, input_ids: torch.Tensor, steps: int,
               compute_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """The head's output hidden states [B, T - 1, H] of each TTT step (row i = draft position i)."""
    length = input_ids.shape[1] - 1
    dtype = compute_dtype or head.dtype
    hidden = head.project_features(features[:, :length].to(head.dtype))
    keys, values, outputs = [], [], []
    for j in range(steps):
        cos, sin = head.rotary(torch.arange(j, j + length, device=input_ids.device), dtype)
        embeds = head.embed(shift_left(input_ids, j + 1)[:, :length])
        mask = None if j == 0 else ttt_attention_mask(length, j, input_ids.device)[None, None]
        past = None if j == 0 else (torch.cat(keys, dim=2), torch.cat(values, dim=2))
        hidden, k, v = layer_step(head, embeds, hidden, cos, sin, mask, past)
        keys.append(k)
        values.append(v)
        outputs.append(hidden)
    return outputs


def target_to_draft(head: DraftHead) -> torch.Tensor | None:
    """Draft index of each target id, -1 outside the draft vocabulary (None when they are the same)."""
    if not isinstance(head, Eagle3Head) or head.config.draft_vocab_size == head.config.vocab_size:
        return None
    return torch.where(head.t2d, head.t2d.long().cumsum(0) - 1, -1)


@dataclass
class StepStats:
    """Sums over the positions of one TTT step (add batches, then read the means)."""

    loss: float = 0.0
    correct: int = 0  # head argmax == target argmax
    topk_correct: int = 0  # target argmax among the head's top `topk` (a tree's first-level branching)
    accept_mass: float = 0.0  # sum over positions of sum_x min(p(x), q(x)): acceptance when sampling at T = 1
    count: int = 0

    def add(self, other: StepStats) -> None:
        for name in ("loss", "correct", "topk_correct", "accept_mass", "count"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def means(self) -> dict[str, float]:
        n = max(self.count, 1)
        return {"loss": self.loss / n, "acc": self.correct / n, "topk_acc": self.topk_correct / n,
                "sample_accept": self.accept_mass / n, "positions": self.count}


@dataclass
class TTTResult:
    loss: torch.Tensor  # weighted sum over steps of the per-step mean loss (differentiable)
    steps: list[StepStats] = field(default_factory=list)


class TargetDist(NamedTuple):
    """The target's distribution at the positions one TTT step predicts."""

    ids: torch.Tensor  # [B, L, k] indices into the head's vocabulary (0 where outside it)
    probs: torch.Tensor  # [B, L, k] restricted to the head's vocabulary and renormalised
    raw_probs: torch.Tensor  # [B, L, k] the stored top-k probabilities (0 where outside the head's vocabulary)
    valid: torch.Tensor  # [B, L] bool
    argmax: torch.Tensor  # [B, L] target ids


def _target_dist(batch: FeatureBatch, shift: int, length: int, t2d_index: torch.Tensor | None) -> TargetDist:
    ids = shift_left(batch.topk_ids, shift)[:, :length]
    probs = shift_left(batch.topk_probs, shift)[:, :length].float()
    valid = shift_left(batch.loss_mask, shift)[:, :length]
    argmax = ids[..., 0]
    if t2d_index is None:
        return TargetDist(ids, probs, probs, valid, argmax)
    ids = t2d_index[ids]
    raw = probs * (ids >= 0)
    mass = raw.sum(-1, keepdim=True)
    valid = valid & (mass[..., 0] > 0)  # no top-k id in the draft vocabulary: nothing to learn from
    return TargetDist(ids.clamp_min(0), raw / mass.clamp_min(1e-12), raw, valid, argmax)


@torch.no_grad()
def _agreement(head: DraftHead, logp: torch.Tensor, target: TargetDist, topk: int) -> StepStats:
    head_top = head.to_target_ids(logp.topk(min(topk, logp.shape[-1]), dim=-1).indices)
    q = logp.gather(-1, target.ids).exp()  # the head's probability of each top-k target id
    accept = torch.minimum(target.raw_probs, q).sum(-1)
    valid = target.valid
    return StepStats(
        correct=int(((head_top[..., 0] == target.argmax) & valid).sum()),
        topk_correct=int(((head_top == target.argmax[..., None]).any(-1) & valid).sum()),
        accept_mass=float((accept * valid).sum()),
        count=int(valid.sum()),
    )


def ttt_loss(head: DraftHead, batch: FeatureBatch, steps: int, decay: float = 0.8, ce_weight: float = 0.1,
             compute_dtype: torch.dtype | None = None, topk: int = 10) -> TTTResult:
    """The TTT training loss of `head` on `batch`, with per-step statistics.

    EAGLE-3 heads: soft cross-entropy over the draft vocabulary. EAGLE-1 heads: smooth-L1 on the
    next target feature + `ce_weight` x soft cross-entropy through the target's lm_head.
    """
    length = batch.input_ids.shape[1] - 1
    outputs = ttt_unroll(head, batch.features, batch.input_ids, steps, compute_dtype)
    t2d_index = target_to_draft(head)
    total = torch.zeros((), device=batch.input_ids.device)
    result = TTTResult(total)
    for j, out in enumerate(outputs):
        target = _target_dist(batch, j + 1, length, t2d_index)
        logp = torch.log_softmax(head.logits(out).float(), dim=-1)
        per_position = -(target.probs * logp.gather(-1, target.ids)).sum(-1)
        if not isinstance(head, Eagle3Head):
            next_feature = shift_left(batch.features, j + 1)[:, :length].float()
            regression = F.smooth_l1_loss(out.float(), next_feature, reduction="none").mean(-1)
            per_position = regression + ce_weight * per_position
        weight = target.valid.float()
        step_loss = (per_position * weight).sum() / weight.sum().clamp_min(1.0)
        total = total + decay**j * step_loss
        stats = _agreement(head, logp.detach(), target, topk)
        stats.loss = float(step_loss.detach()) * stats.count
        result.steps.append(stats)
    result.loss = total
    return result
