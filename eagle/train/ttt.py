"""Training-time test (TTT): unroll the draft head on its own outputs, as tree drafting does, and score each step.

Step 0 at draft position i reads (target feature at i, token i + 1) and predicts token i + 2, the
target's distribution at position i + 1. Step j > 0 reads (the head's own output of step j - 1 at
position i, token i + j + 1) and predicts token i + j + 2. This is `DraftHead.propose` along one
branch: the step-j query sits at rotary position i + j and sees the step-0 keys at positions <= i
(the committed prefix), the keys of steps 1..j - 1 at the same i (its ancestors) and itself. The
ancestors of one position are on the diagonal of each earlier step's block, so all positions of a
step run as one batch with the mask built by `ttt_attention_mask`.

Loss at step j, weighted decay**j, against the target's distribution p in the form the batch carries
(`eagle.train.data`):
  - top-k: soft cross-entropy between the head's q over its vocabulary and p's stored top-k restricted
    to that vocabulary and renormalised;
  - full: forward KL(p_V || q), p_V the target's full temperature-1 distribution restricted to the
    head's vocabulary V and renormalised. q is zero outside V, so p_V is the closest q can come to p,
    and it is also a q that maximises sum_x min(p(x), q(x)) (= p's mass on V, reached by every q >= p
    on V), the acceptance of a token sampled from q under rejection sampling at T = 1. The KL is
    reported rather than the cross-entropy so that 0 means "as good as the vocabulary allows".
EAGLE-1 adds smooth-L1 regression of the next target feature (the cross-entropy term weighted 0.1).
Positions whose inputs run off the sequence end are masked.

Per-step statistics (`StepStats`): head top-1 == target top-1, target top-1 in the head's top 10,
and sum_x min(p, q): with a full distribution p is the target's whole softmax and q the head's,
zero outside its vocabulary (`sample_accept`, the true acceptance of one sampled draft token); with
top-k data only the renormalised top-k is known, and the figure, which overstates the acceptance
(0.74 against the true 0.55 for the shipped embedded head), is named `sample_accept_topk`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from eagle.heads import DraftHead, Eagle3Head
from eagle.train.data import FeatureBatch, target_logprobs


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
               compute_dtype: torch.dtype | None = None, doc_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The head's output hidden states [B, T - 1, H] of each TTT step (row i = draft position i).

    doc_ids [B, T] (packed windows): step 0's causal attention is cut at sequence boundaries, so each
    position sees only its own sequence, as if each sequence sat alone in its row. Rotary positions stay
    those of the window: attention depends only on the distance between two positions of one sequence.
    """
    length = input_ids.shape[1] - 1
    dtype = compute_dtype or head.dtype
    hidden = head.project_features(features[:, :length].to(head.dtype))
    causal = None
    if doc_ids is not None:
        docs = doc_ids[:, :length]
        causal = (ttt_attention_mask(length, 0, input_ids.device) & (docs[:, :, None] == docs[:, None, :]))[:, None]
    keys, values, outputs = [], [], []
    for j in range(steps):
        cos, sin = head.rotary(torch.arange(j, j + length, device=input_ids.device), dtype)
        embeds = head.embed(shift_left(input_ids, j + 1)[:, :length])
        if j == 0:
            mask = causal
        elif causal is None:
            mask = ttt_attention_mask(length, j, input_ids.device)[None, None]
        else:
            diagonal = torch.eye(length, dtype=torch.bool, device=input_ids.device).expand(len(causal), 1, -1, -1)
            mask = torch.cat([causal] + [diagonal] * j, dim=-1)
        past = None if j == 0 else (torch.cat(keys, dim=2), torch.cat(values, dim=2))
        hidden, k, v = layer_step(head, embeds, hidden, cos, sin, mask, past)
        keys.append(k)
        values.append(v)
        outputs.append(hidden)
    return outputs


def step_valid(batch: FeatureBatch, shift: int, length: int) -> torch.Tensor:
    """[B, length] bool: draft position i is trained at the TTT step predicting from position i + shift
    (its target there is inside a response, and, in a packed window, of the same sequence as i)."""
    valid = shift_left(batch.loss_mask, shift)[:, :length]
    if batch.doc_ids is not None:
        valid = valid & (shift_left(batch.doc_ids, shift)[:, :length] == batch.doc_ids[:, :length])
    return valid


def target_to_draft(head: DraftHead) -> torch.Tensor | None:
    """Draft index of each target id, -1 outside the draft vocabulary (None when they are the same)."""
    if not isinstance(head, Eagle3Head) or head.config.draft_vocab_size == head.config.vocab_size:
        return None
    return torch.where(head.t2d, head.t2d.long().cumsum(0) - 1, -1)


def head_vocab_ids(head: DraftHead, device: torch.device | str | None = None) -> torch.Tensor:
    """The target id of each of the head's output classes, in order [Vh]."""
    size = head.config.draft_vocab_size if isinstance(head, Eagle3Head) else head.config.vocab_size
    return head.to_target_ids(torch.arange(size, device=device if device is not None else head.device))


@dataclass
class StepStats:
    """Sums over the positions of one TTT step (add batches, then read the means)."""

    loss: float = 0.0
    correct: int = 0  # head argmax == target argmax
    topk_correct: int = 0  # target argmax among the head's top `topk` (a tree's first-level branching)
    accept_mass: float = 0.0  # sum over positions of sum_x min(p(x), q(x)): acceptance when sampling at T = 1
    vocab_mass: float = 0.0  # full distribution: sum over positions of p's mass on the head's vocabulary
    count: int = 0
    target_dist: str = "full"  # which p accept_mass used: the full softmax, or the renormalised top-k

    def add(self, other: StepStats) -> None:
        if self.count and other.count and other.target_dist != self.target_dist:
            raise ValueError(f"cannot add statistics against a {other.target_dist} target distribution "
                             f"to ones against a {self.target_dist} one")
        for name in ("loss", "correct", "topk_correct", "accept_mass", "vocab_mass", "count"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.count:
            self.target_dist = other.target_dist

    def means(self) -> dict[str, float]:
        n = max(self.count, 1)
        if self.target_dist != "full":
            return {"loss": self.loss / n, "acc": self.correct / n, "topk_acc": self.topk_correct / n,
                    "sample_accept_topk": self.accept_mass / n, "positions": self.count}
        # draft_vocab_mass: the ceiling of sample_accept, which no q on the draft vocabulary can pass
        return {"loss": self.loss / n, "acc": self.correct / n, "topk_acc": self.topk_correct / n,
                "sample_accept": self.accept_mass / n, "draft_vocab_mass": self.vocab_mass / n,
                "positions": self.count}


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
    valid = step_valid(batch, shift, length)
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
        target_dist="topk",
    )


def full_kl(head_logp: torch.Tensor, target_logp: torch.Tensor, vocab_ids: torch.Tensor) -> torch.Tensor:
    """KL(p_V || q) per position: `target_logp` [..., V] the target's full log-distribution, `head_logp`
    [..., Vh] the head's over its vocabulary, whose target ids are `vocab_ids` [Vh]; p_V is p restricted
    to those ids and renormalised (see the module doc for why)."""
    restricted = target_logp[..., vocab_ids]
    log_pv = restricted - restricted.logsumexp(-1, keepdim=True)
    return (log_pv.exp() * (log_pv - head_logp)).sum(-1)


@torch.no_grad()
def _full_agreement(head: DraftHead, logp: torch.Tensor, target_logp: torch.Tensor, vocab_ids: torch.Tensor,
                    valid: torch.Tensor, topk: int) -> StepStats:
    """Statistics against the target's full distribution; q is zero outside the head's vocabulary, so
    sum_x min(p, q) runs over that vocabulary with p unrenormalised."""
    argmax = target_logp.argmax(-1)
    head_top = head.to_target_ids(logp.topk(min(topk, logp.shape[-1]), dim=-1).indices)
    p_vocab = target_logp[..., vocab_ids].exp()
    accept = torch.minimum(p_vocab, logp.exp()).sum(-1)
    return StepStats(
        correct=int(((head_top[..., 0] == argmax) & valid).sum()),
        topk_correct=int(((head_top == argmax[..., None]).any(-1) & valid).sum()),
        accept_mass=float((accept * valid).sum()),
        vocab_mass=float((p_vocab.sum(-1) * valid).sum()),
        count=int(valid.sum()),
    )


def ttt_loss(head: DraftHead, batch: FeatureBatch, steps: int, decay: float = 0.8, ce_weight: float = 0.1,
             compute_dtype: torch.dtype | None = None, topk: int = 10,
             target_lm_head: nn.Module | None = None) -> TTTResult:
    """The TTT training loss of `head` on `batch`, with per-step statistics.

    Against a top-k batch: soft cross-entropy over the head's vocabulary; against a full one (which
    carries the target's last hidden state, turned into its distribution by `target_lm_head`): forward
    KL (module doc). EAGLE-1 heads add smooth-L1 on the next target feature, the distribution term
    weighted `ce_weight`.
    """
    length = batch.input_ids.shape[1] - 1
    full_logp = None
    if batch.last_hidden is not None:
        if target_lm_head is None:
            raise ValueError("a batch with the target's full distribution (last_hidden) needs target_lm_head")
        full_logp = target_logprobs(target_lm_head, batch.last_hidden)
        vocab_ids = head_vocab_ids(head, full_logp.device)
    outputs = ttt_unroll(head, batch.features, batch.input_ids, steps, compute_dtype, batch.doc_ids)
    t2d_index = target_to_draft(head)
    total = torch.zeros((), device=batch.input_ids.device)
    result = TTTResult(total)
    for j, out in enumerate(outputs):
        # Only the trained positions go through the output layer (prompt, padding and positions whose
        # target lies past their sequence carry no loss): on chat answers that is ~40% of the rows.
        if full_logp is not None:
            valid = step_valid(batch, j + 1, length)
            target_logp = shift_left(full_logp, j + 1)[:, :length][valid]  # [N, V]
            logp = torch.log_softmax(head.logits(out[valid]).float(), dim=-1)  # [N, Vh]
            per_position = full_kl(logp, target_logp, vocab_ids)
            stats = _full_agreement(head, logp.detach(), target_logp, vocab_ids,
                                    torch.ones_like(per_position, dtype=torch.bool), topk)
        else:
            target = _target_dist(batch, j + 1, length, t2d_index)
            valid = target.valid
            trained = TargetDist(*(x[valid] for x in target))  # [N, k] / [N]
            logp = torch.log_softmax(head.logits(out[valid]).float(), dim=-1)  # [N, Vh]
            per_position = -(trained.probs * logp.gather(-1, trained.ids)).sum(-1)
            stats = _agreement(head, logp.detach(), trained, topk)
        if not isinstance(head, Eagle3Head):
            next_feature = shift_left(batch.features, j + 1)[:, :length][valid].float()
            regression = F.smooth_l1_loss(out[valid].float(), next_feature, reduction="none").mean(-1)
            per_position = regression + ce_weight * per_position
        step_loss = per_position.sum() / max(int(valid.sum()), 1)
        total = total + decay**j * step_loss
        stats.loss = float(step_loss.detach()) * stats.count
        result.steps.append(stats)
    result.loss = total
    return result
