"""Acceptance rules: given the target's processed logits at every tree node, pick the path to keep.

Every rule is a pure function of (processed logits [n, V], tree, settings, RNG) and returns a
`Verdict`: the accepted path (tree node indices, starting at the root), the next token (the
target's bonus or correction token after the path), and one `Step` record per decision.

Each rule judges every node of the tree at once on the logits' device and reads the outcome back to
the host in one transfer (`_read`): on a GPU, verification costs one synchronisation however large
the tree (the sequential walk of the reference code cost several per node).

Shared invariants, tested in `tests/test_verify.py`:
- `path[0] == 0` and each node in `path` is a child of the one before it; len(path) - 1 <= depth.
- The logits at node i are the target's prediction for the token *after* node i, so the child c
  of node i is judged by row i, and `next_token` comes from the row of the path's last node.
- MARS differs from strict only at positions where the margin test passes: elsewhere it makes the
  same decision with the same random draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eagle.tree import DraftTree
from mars.sampling import Margins, SamplingConfig, draw, margin_test


@dataclass
class Step:
    """One verified position: the target's view at a path node, and what happened to its children."""

    depth: int  # depth of the node whose children were judged (0 = root)
    margin: float  # the margin metric's value there
    relax_allowed: bool  # the margin test passed (only acted on by rule "mars")
    accepted: bool  # a child was accepted
    relaxed: bool  # it was accepted only because of the relaxation
    nonfinite: bool
    negative: bool
    has_children: bool


@dataclass
class Verdict:
    path: list[int]  # tree nodes, root first
    next_token: int  # the target's token after the path
    steps: list[Step] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the accepted drafted tokens (path[1:]'s)

    @property
    def accepted(self) -> int:
        return len(self.path) - 1

    @property
    def relaxed(self) -> int:
        return sum(s.relaxed for s in self.steps)


# The per-node facts a Step records, packed side by side for one transfer.
_STEP_FIELDS = 7  # depth, margin, relax_allowed, nonfinite, negative, has_children, relaxed (its accepted child)


def _children(tree: DraftTree) -> torch.Tensor:
    """[n, n] bool: j is a child of i (columns in draft order)."""
    nodes = torch.arange(tree.size, device=tree.parents.device)
    return tree.parents[None, :] == nodes[:, None]


def _read(m: Margins, tree: DraftTree, chain: torch.Tensor, relaxed: torch.Tensor, has_children: torch.Tensor,
          scalars: list[torch.Tensor]) -> tuple[list[int], list[int], list[list[float]], list[float]]:
    """The one device-to-host transfer of a verdict: chain [L] node ids, their tokens, the Step facts
    of each, and `scalars`. relaxed [L]: the chain node's accepted child was accepted by the relaxation."""
    facts = torch.stack([tree.depths[chain].double(), m.value[chain].double(), m.passes[chain].double(),
                         m.nonfinite[chain].double(), m.negative[chain].double(), has_children[chain].double(),
                         relaxed.double()], dim=1)
    packed = torch.cat([chain.double(), tree.tokens[chain].double(), facts.flatten(),
                        torch.stack(scalars).double().flatten()]).tolist()
    length = chain.shape[0]
    rows = [packed[2 * length + i * _STEP_FIELDS: 2 * length + (i + 1) * _STEP_FIELDS] for i in range(length)]
    ids, tokens = [int(x) for x in packed[:length]], [int(x) for x in packed[length: 2 * length]]
    return ids, tokens, rows, packed[2 * length + length * _STEP_FIELDS:]


def _steps(path: list[int], rows: list[list[float]]) -> list[Step]:
    steps = []
    for j, (depth, margin, allowed, nonfinite, negative, has_children, relaxed) in enumerate(rows):
        accepted = j + 1 < len(path)
        steps.append(Step(int(depth), margin, bool(allowed), accepted, accepted and bool(relaxed),
                          bool(nonfinite), bool(negative), bool(has_children)))
    return steps


def accept_greedy(processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig) -> Verdict:
    """Greedy verification, strict or MARS.

    processed [n, V]: the target's processed logits at every tree node (row i judges i's children).
    A node is valid when its token is the target's top-1 at its parent, or (rule "mars" only) the
    margin test passes at the parent and the token is the top-2 there. The accepted path is the
    deepest root-to-node path of valid nodes; ties go to the path with fewer relaxed (top-2)
    tokens, then to the earliest node in draft order. The next token is the top-1 after the path.
    With rule "strict" the output equals plain greedy decoding token for token.
    """
    m = margin_test(processed, cfg)
    n, device = tree.size, processed.device
    nodes = torch.arange(n, device=device)
    parent = tree.parents.clamp(min=0)
    exact = tree.tokens == m.top1[parent]
    relaxed_edge = ~exact & (tree.tokens == m.top2[parent]) & (m.passes[parent] if cfg.rule == "mars" else False)
    valid = (exact | relaxed_edge) | (nodes == 0)
    relaxed_edge &= nodes > 0
    reachable = ~(tree.ancestors & ~valid[None, :]).any(dim=1)  # every node on its path is valid
    relaxed_count = (tree.ancestors & relaxed_edge[None, :]).sum(dim=1)
    key = tree.depths * (n + 1) ** 2 - relaxed_count * (n + 1) - nodes  # deeper, fewer relaxed, earlier
    best = torch.where(reachable, key, key.min() - 1).argmax()
    up = [best]  # best, its parent, ... padded with the root
    for _ in range(tree.levels):
        up.append(parent[up[-1]])
    chain = torch.stack(up[::-1])  # [levels + 1]: the root (repeated), ..., best
    relaxed = torch.cat([relaxed_edge[chain[1:]], relaxed_edge[:1]])  # the next chain node's edge (root's: False)
    has_children = _children(tree).any(dim=1)
    ids, tokens, rows, (depth, next_token) = _read(m, tree, chain, relaxed, has_children,
                                                   [tree.depths[best], m.top1[best]])
    first = len(ids) - int(depth) - 1
    return Verdict(ids[first:], int(next_token), _steps(ids[first:], rows[first:]), tokens[first + 1:])


def accept_sampling(
    processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig, generator: torch.Generator | None
) -> Verdict:
    """Tree speculative sampling, strict or MARS, for children drafted deterministically (top-k).

    processed [n, V]: the target's processed logits at every tree node (row i judges i's children).
    Strict (lossless): at the current node with target distribution p, try its children in draft
    order; child x is accepted with probability r(x) under the current residual r (initially p);
    on rejection r(x) is set to 0 and r renormalised. If every child is rejected, the correction
    token is sampled from r; if a node without children is reached, the bonus token is sampled
    from p. Because drafted children are deterministic (q = 1 on the drafted token), this emits
    each token with exactly probability p: P(x_j) = prod_{i<j}(1 - r_i(x_i)) r_j(x_j) = p(x_j).

    MARS: where the margin test passes, the first child (draft order) that is the target's top-1
    or top-2 is accepted outright (`relaxed`). If none is, `mars_fallback="strict"` hands the
    children to the strict rule; `"reference"` rejects them all and samples from p unadjusted (the
    MARS code's behaviour). Where the test fails, the strict rule runs with the same RNG draws.

    Random draws, the same for every rule: `u = rand(n, n)` first, the j-th child (draft order) of
    node i uses u[i, j]; then one `multinomial` for the bonus or correction token. Every node's
    decision is computed at once, then the path is followed from the root.
    """
    m = margin_test(processed, cfg)
    n, device = tree.size, processed.device
    nodes = torch.arange(n, device=device)
    probs = processed.softmax(dim=-1)  # [n, V]
    kids = _children(tree)  # [n, n]
    u = torch.rand(n, n, generator=generator, device=device)
    rank = (kids.long().cumsum(dim=1) - 1).clamp(min=0)  # j's place among i's children
    p_child = kids * probs[:, tree.tokens]  # [i, j]: p_i(token of child j)
    mass = probs.sum(dim=-1, keepdim=True) - (p_child.cumsum(dim=1) - p_child)  # residual mass before trying j
    strict_ok = kids & (mass > 0) & (u.gather(1, rank) * mass < p_child)
    none = torch.full_like(nodes, n)
    first_strict = torch.where(strict_ok, nodes[None, :], n).min(dim=1).values
    if cfg.rule == "mars":
        top = (tree.tokens[None, :] == m.top1[:, None]) | (tree.tokens[None, :] == m.top2[:, None])
        first_top = torch.where(kids & top, nodes[None, :], n).min(dim=1).values
        relaxed = m.passes & (first_top < n)
        fallback = first_strict if cfg.mars_fallback == "strict" else none
        chosen = torch.where(relaxed, first_top, torch.where(m.passes, fallback, first_strict))
        unadjusted = m.passes & ~relaxed & (cfg.mars_fallback == "reference")  # reject all, sample p
    else:
        relaxed, chosen, unadjusted = torch.zeros_like(m.passes), first_strict, torch.zeros_like(m.passes)
    walk = [nodes[0]]
    for _ in range(tree.levels):
        step = chosen[walk[-1]]
        walk.append(torch.where(step < n, step, walk[-1]))
    chain = torch.stack(walk)
    last = chain[-1]
    has_children = kids.any(dim=1)
    # The last node's distribution: p at a leaf or after a reference-fallback rejection, else the residual.
    drafted = torch.zeros(probs.shape[-1], device=device).index_add_(0, tree.tokens, kids[last].float()) > 0
    residual = probs[last].masked_fill(drafted, 0.0)
    total = residual.sum()
    use_residual = has_children[last] & ~unadjusted[last] & (total > 0)
    dist = torch.where(use_residual, residual / total.clamp(min=torch.finfo(total.dtype).tiny), probs[last])
    token = draw(dist, generator)[0]
    ids, tokens, rows, (depth, next_token) = _read(m, tree, chain, relaxed[chain], has_children,
                                                   [tree.depths[last], token])
    length = int(depth) + 1
    return Verdict(ids[:length], int(next_token), _steps(ids[:length], rows[:length]), tokens[1:length])


def accept(
    processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig, generator: torch.Generator | None = None
) -> Verdict:
    """The acceptance rule `cfg` asks for: `accept_greedy` at temperature 0, else `accept_sampling`.

    `processed` = `process_logits(target logits over the tree, cfg)`.
    """
    if cfg.greedy:
        return accept_greedy(processed, tree, cfg)
    return accept_sampling(processed, tree, cfg, generator)
