"""The strict trial of a node's children: each child's acceptance ratio and the residual after them.

At a node with target distribution p, children x_1..x_k are tried in draw order. The strict rule
accepts x_i with probability min(1, r_i(x_i) / q_i(x_i)) and, if every child is rejected, draws the
correction token from r_{k+1} (Jeon et al. 2024, "Recursive Speculative Decoding", recursive
rejection sampling):

    r_1 = p,   r_{i+1} = norm(max(0, r_i - q_i)),
    q_1 = q,   q_{i+1} = q_i with x_i removed, renormalised (the distribution x_{i+1} was drawn from).

Why it is lossless: one step "draw x ~ q_i, accept with min(1, r_i/q_i), else emit a sample of
norm(max(0, r_i - q_i))" emits r_i exactly, whatever q_i is; r_{i+1} depends only on r_i and q_i
(not on x_i), so running the same step recursively for r_{i+1}, with the next draw as proposal,
emits r_{i+1} exactly, and by induction the node emits p. The only requirement on the draws is that
x_i ~ q_i given the earlier ones: children sampled without replacement from q, kept as a prefix in
draw order (`eagle.sampled_trees.sample_tree`).

Two forms, one meaning:
- `topk_trial`: children are the head's deterministic top-k (q_i = 1 on x_i). Then r_i(x_i) / q_i(x_i)
  is r_i(x_i), and the residual is p with the tried children zeroed, renormalised. No loop.
- `recursive_trial`: children drawn from q [n, V] without replacement. One pass per sibling rank
  over every node at once (`width` passes), on the device.
Both return the same `Trial`; `mars.verification.verify` draws against it, `mars.accounting.cost` integrates it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Trial(NamedTuple):
    ratio: torch.Tensor  # [n, n] r_i(x) / q_i(x) for child column x of row i (accept iff u < ratio); 0 elsewhere
    testable: torch.Tensor  # [n, n] bool: child of i whose trial is defined (its residual has mass)
    residual: torch.Tensor  # [n, V] r after every child of i is rejected, normalised (p for a childless node)


def _normalised(rows: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = rows.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, rows / total.clamp(min=torch.finfo(rows.dtype).tiny), fallback)


def topk_trial(probs: torch.Tensor, kids: torch.Tensor, tokens: torch.Tensor) -> Trial:
    """The strict trial for deterministic children. probs [n, V] p_i; kids [n, n] bool (columns in
    draft order); tokens [n] node tokens."""
    pc = kids * probs[:, tokens]  # [n, n] p_i(x_j) for children j of i
    mass = probs.sum(dim=-1, keepdim=True) - (pc.cumsum(dim=1) - pc)  # residual mass before trying j
    testable = kids & (mass > 0)
    ratio = torch.where(testable, pc / mass.clamp(min=torch.finfo(mass.dtype).tiny), 0.0)
    drafted = torch.zeros_like(probs).scatter_add_(1, tokens[None].expand_as(kids), kids.to(probs.dtype)) > 0
    return Trial(ratio, testable, _normalised(probs.masked_fill(drafted, 0.0), probs))


def child_table(kids: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width] long: the r-th child (draft order) of each node, n where it has fewer (on the device)."""
    n = kids.shape[0]
    rank = kids.long().cumsum(dim=1) - 1
    slot = torch.where(kids, rank, width)  # non-children land in a spare column, dropped below
    columns = torch.arange(n, device=kids.device).expand(n, n)
    table = torch.full((n, width + 1), n, dtype=torch.long, device=kids.device)
    return table.scatter(1, slot, torch.where(kids, columns, n))[:, :width]


def recursive_trial(probs: torch.Tensor, draft: torch.Tensor, kids: torch.Tensor, tokens: torch.Tensor,
                    width: int) -> Trial:
    """The strict trial for children sampled without replacement from `draft`.

    probs [n, V] p_i; draft [n, V] q_i the distribution node i's children were drawn from (rows of
    childless nodes unused); kids [n, n] bool (columns in draw order); tokens [n]; width: the most
    children any node has (known on the host from the tree's shape, so no read here).
    """
    n = kids.shape[0]
    table = child_table(kids, width)  # [n, width]
    padded = torch.cat([tokens, tokens.new_zeros(1)])
    residual, remaining = probs, draft.float()  # r_i (unnormalised) and q without the drawn children
    ratio = torch.zeros(n, n + 1, dtype=probs.dtype, device=probs.device)
    testable = torch.zeros(n, n + 1, dtype=torch.bool, device=probs.device)
    for r in range(width):
        column = table[:, r]  # [n]
        present = column < n
        x = padded[column][:, None]  # [n, 1]
        r_mass, q_mass = residual.sum(dim=-1), remaining.sum(dim=-1)
        r_x, q_x = residual.gather(1, x)[:, 0], remaining.gather(1, x)[:, 0]
        ok = present & (r_mass > 0) & (q_x > 0)
        tiny = torch.finfo(probs.dtype).tiny
        value = (r_x / r_mass.clamp(min=tiny)) / (q_x / q_mass.clamp(min=tiny)).clamp(min=tiny)
        ratio.scatter_(1, column[:, None], torch.where(ok, value, 0.0)[:, None])
        testable.scatter_(1, column[:, None], ok[:, None])
        nxt = (residual / r_mass[:, None].clamp(min=tiny) - remaining / q_mass[:, None].clamp(min=tiny)).clamp(min=0)
        # Where r_i <= q_i everywhere (x_i accepted with certainty) the residual is never used: keep r_i.
        step = ok & (nxt.sum(dim=-1) > 0)
        residual = torch.where(step[:, None], nxt, residual)
        remaining = torch.where(present[:, None], remaining.scatter(1, x, 0.0), remaining)
    return Trial(ratio[:, :n], testable[:, :n], _normalised(residual, probs))
